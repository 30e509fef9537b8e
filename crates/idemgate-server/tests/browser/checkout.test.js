// The checkout page of `idemgate serve` (GET /demo/checkout, src/demo/) in headless
// Chromium — Debian's `chromium`, driven through its `chromedriver` over WebDriver —
// loaded through the fault relay, which drops the answer to the first order POST:
// one click makes one order and one charge, the page shows the lost attempt and
// then the replay, and a second click on the same cart shows the same order; a
// double-click pays once. The page runs the embedded build of clients/js
// (src/demo/idemgate-client/). Each test's screenshot is saved under
// target/client-tests/ as its artifact when it ends, passed or failed.
// scripts/clients.sh (browser) installs Chromium and runs this.

import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Builder, By, until } from "selenium-webdriver";
import chrome from "selenium-webdriver/chrome.js";

import { MockGateway, Relay, Server, TARGET } from "./processes.js";

const CHROMIUM = process.env["CHROMIUM_BIN"] ?? "/usr/bin/chromium";
const CHROMEDRIVER = process.env["CHROMEDRIVER_BIN"] ?? "/usr/bin/chromedriver";

/** Where the screenshots go: `${CARGO_TARGET_DIR:-target}/client-tests/`. */
const ARTIFACTS = join(TARGET, "client-tests");

/**
 * A headless Chromium for the test, which screenshots the page as `NAME.png` when the test ends, however it ends.
 * @param {import("node:test").TestContext} t
 * @param {string} name
 * @returns {Promise<import("selenium-webdriver").WebDriver>}
 */
async function browser(t, name) {
  for (const binary of [CHROMIUM, CHROMEDRIVER]) {
    if (!existsSync(binary)) {
      throw new Error(`${binary} is missing: scripts/services.sh clients installs Debian's chromium and chromium-driver`);
    }
  }
  const profile = mkdtempSync(join(tmpdir(), "idemgate-chromium-"));
  const options = new chrome.Options();
  options.setChromeBinaryPath(CHROMIUM);
  options.addArguments(
    "--headless",
    "--no-sandbox", // as root, in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1000,1100",
    `--user-data-dir=${profile}`,
  );
  const driver = await new Builder()
    .forBrowser("chrome")
    .setChromeOptions(options)
    .setChromeService(new chrome.ServiceBuilder(CHROMEDRIVER))
    .build();
  t.after(async () => {
    try {
      mkdirSync(ARTIFACTS, { recursive: true });
      const screenshot = join(ARTIFACTS, `${name}.png`);
      writeFileSync(screenshot, await driver.takeScreenshot(), "base64");
      console.log(`# screenshot: ${screenshot}`);
    } catch (error) {
      console.error(`# no screenshot of ${name}: ${String(error)}`);
    } finally {
      await driver.quit();
      rmSync(profile, { recursive: true, force: true });
    }
  });
  return driver;
}

/**
 * The attempts table, row by row: [#, key digest, answer, replayed, then].
 * @param {import("selenium-webdriver").WebDriver} driver
 * @returns {Promise<string[][]>}
 */
async function attemptRows(driver) {
  return await driver.executeScript(
    "return [...document.querySelectorAll('#attempts tbody tr')].map(r => [...r.cells].map(c => c.textContent))",
  );
}

/**
 * Polls `probe` until it holds.
 * @param {string} what
 * @param {() => Promise<boolean>} probe
 */
async function eventually(what, probe, timeoutMs = 15_000) {
  const started = Date.now();
  while (!(await probe())) {
    if (Date.now() - started > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((done) => setTimeout(done, 50));
  }
}

/** @param {import("selenium-webdriver").WebDriver} driver */
async function demoToken(driver) {
  return /** @type {string} */ (await driver.executeScript("return sessionStorage.getItem('idemgate-demo-token')"));
}

test("the checkout page: a lost answer is retried, one order, the replay shown", { timeout: 120_000 }, async (t) => {
  const gateway = await MockGateway.start(t);
  // A short idle timeout closes the page load's kept-alive connections, so the
  // order goes out on a fresh one: Chromium itself silently resends a request
  // whose reused connection dies, and the page should see this loss itself.
  const server = await Server.start(t, gateway, ["--idle-timeout-ms", "300"]);
  const relay = await Relay.start(t, server.addr);
  const driver = await browser(t, "checkout");

  await driver.get(relay.url("/demo/checkout"));
  await driver.wait(until.elementLocated(By.css("body[data-ready='true']")), 15_000);
  assert.equal(await driver.getTitle(), "idemgate checkout");
  await eventually("the page's connections to close", async () => (await relay.stats()).open === 0);

  await relay.faultRequests("lose-response", 1, "POST");
  await driver.findElement(By.id("pay")).click();
  const result = await driver.wait(until.elementLocated(By.css("#result[data-state='paid']")), 20_000);
  const orderId = await result.getAttribute("data-order-id");
  assert.equal(await result.getAttribute("data-replayed"), "true", await result.getText());

  const rows = await attemptRows(driver);
  assert.equal(rows.length, 2, JSON.stringify(rows));
  const [first, second] = /** @type {[string[], string[]]} */ (rows);
  assert.deepEqual([first[0], second[0]], ["1.1", "1.2"], "one click, two attempts");
  assert.equal(first[2], "no answer", "the first attempt's answer was lost");
  assert.match(first[4] ?? "", /^retry in \d+ ms$/);
  assert.equal(second[2], "201");
  assert.equal(second[3], "yes", "the retry got the first attempt's outcome, replayed");
  assert.match(first[1] ?? "", /^sha256:[0-9a-f]{12}…$/);
  assert.equal(second[1], first[1], "one key for both attempts");

  const token = await demoToken(driver);
  const orders = await server.orders(token);
  assert.equal(orders.length, 1, JSON.stringify(orders));
  assert.equal(String(orders[0]?.["order_id"]), orderId);
  assert.equal(gateway.calls.length, 1, "charged once");
  await driver.wait(until.elementTextIs(driver.findElement(By.id("order-count")), "1"), 5_000);

  // The user, unsure, clicks "Pay" again on the same cart: the same purchase.
  await driver.findElement(By.id("pay")).click();
  await eventually("the second click's attempt", async () => (await attemptRows(driver)).length === 3);
  await driver.wait(until.elementLocated(By.css("#result[data-state='paid']")), 20_000);
  const third = (await attemptRows(driver))[2] ?? [];
  assert.deepEqual(third.slice(0, 4), ["2.1", first[1], "201", "yes"], "the same key, replayed at once");
  assert.equal(await driver.findElement(By.id("result")).getAttribute("data-order-id"), orderId, "the same order");
  assert.equal((await server.orders(token)).length, 1);
  assert.equal(gateway.calls.length, 1, "still charged once");
});

test("the checkout page: a double-click on Pay is one payment", { timeout: 120_000 }, async (t) => {
  const gateway = await MockGateway.start(t);
  gateway.delayMs = 500; // the first click's payment is still under way when the second lands
  const server = await Server.start(t, gateway);
  const relay = await Relay.start(t, server.addr);
  const driver = await browser(t, "checkout-double-click");

  await driver.get(relay.url("/demo/checkout"));
  await driver.wait(until.elementLocated(By.css("body[data-ready='true']")), 15_000);
  // Two clicks in one task: the second lands before the first's handler has
  // reached its first await, let alone disabled the button's rendering.
  await driver.executeScript("const pay = document.getElementById('pay'); pay.click(); pay.click();");
  await driver.wait(until.elementLocated(By.css("#result[data-state='paid']")), 20_000);
  await driver.wait(until.elementTextIs(driver.findElement(By.id("order-count")), "1"), 5_000);

  const rows = await attemptRows(driver);
  assert.deepEqual(
    rows.map((row) => [row[0], row[2]]),
    [["1.1", "201"]],
    `one click's one attempt, no second payment: ${JSON.stringify(rows)}`,
  );
  assert.equal((await server.orders(await demoToken(driver))).length, 1);
  assert.equal(gateway.calls.length, 1, "charged once");
});
