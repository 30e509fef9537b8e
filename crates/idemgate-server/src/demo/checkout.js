// The checkout page's script: places an order through idemgate-client (clients/js,
// embedded beside this file) with one Idempotency-Key per purchase, and shows each
// attempt as it happens.
//
// The key of a cart's purchase is made on its first "Pay" and kept in
// sessionStorage under the cart's content: a second click on the same cart — the
// user who saw nothing happen — and a reload mid-payment resume that purchase
// rather than making a second one. Changing the cart, or "New order", starts a new
// purchase with a new key.

import { Client, IdemgateError, Operation, retryPolicy } from "./idemgate-client/index.js";

const TOKEN_KEY = "idemgate-demo-token";
const PURCHASE_PREFIX = "idemgate-demo-purchase:";

/** This tab's demo identity: any bearer token is a principal to `idemgate serve`. */
function demoToken() {
  let token = sessionStorage.getItem(TOKEN_KEY);
  if (token === null) {
    token = `demo-${crypto.randomUUID()}`;
    sessionStorage.setItem(TOKEN_KEY, token);
  }
  return token;
}

const token = demoToken();
const client = new Client({
  headers: { authorization: `Bearer ${token}` },
  // A person waits at most 20 s for a payment before the page says "unknown".
  policy: retryPolicy({ deadlineMs: 20_000 }),
});

const $ = (selector) => document.querySelector(selector);
const payButton = $("#pay");
const result = $("#result");
const attemptsBody = $("#attempts tbody");

/** The order the cart makes: the same cart always serializes to the same bytes. */
function cartOrder() {
  const items = [];
  let amount = 0;
  for (const row of document.querySelectorAll("#cart tbody tr")) {
    const quantity = Number(row.querySelector("input").value);
    if (Number.isInteger(quantity) && quantity > 0) {
      items.push({ id: Number(row.dataset.item), quantity });
      amount += quantity * Number(row.dataset.price);
    }
  }
  return { items, currency: "RUB", amount };
}

/** The purchase of this cart: the stored one, or a new one when `create`. */
function purchase(order, create) {
  const name = PURCHASE_PREFIX + JSON.stringify(order);
  const stored = sessionStorage.getItem(name);
  if (stored !== null) return Operation.resume(stored);
  if (!create) return null;
  const made = Operation.create();
  sessionStorage.setItem(name, made.key);
  return made;
}

function forgetPurchase(order) {
  sessionStorage.removeItem(PURCHASE_PREFIX + JSON.stringify(order));
}

function showTotal() {
  const { amount } = cartOrder();
  $("#total").textContent = `${(amount / 100).toFixed(2)} RUB`;
}

function show(state, text, details = {}) {
  result.dataset.state = state;
  result.textContent = text;
  for (const [name, value] of Object.entries(details)) result.dataset[name] = String(value);
}

let clicks = 0;
// A payment is under way: a second click (a double-click, or an impatient one
// before the button shows disabled) joins it rather than starting another.
let paying = false;

function addAttempt(click, digest, report) {
  const row = attemptsBody.insertRow();
  row.dataset.status = report.status === undefined ? "none" : String(report.status);
  row.dataset.replayed = String(report.replayed);
  const cells = [
    `${click}.${report.attempt}`,
    `${digest}…`,
    report.status === undefined ? "no answer" : String(report.status),
    report.replayed ? "yes" : "no",
    report.retryInMs === undefined ? "—" : `retry in ${Math.round(report.retryInMs)} ms`,
  ];
  for (const text of cells) row.insertCell().textContent = text;
  if (report.status === undefined) row.cells[2].className = "lost";
  if (report.replayed) row.cells[3].className = "replayed";
}

async function refreshOrderCount() {
  try {
    const reply = await client.send(null, { method: "GET", url: "/api/v1/orders" });
    $("#order-count").textContent = String(reply.json().orders.length);
  } catch {
    $("#order-count").textContent = "?";
  }
}

async function pay() {
  if (paying) return;
  const order = cartOrder();
  if (order.items.length === 0) {
    show("failed", "The cart is empty.");
    return;
  }
  // Taken before the first await: the click after it finds the payment under way.
  paying = true;
  payButton.disabled = true;
  try {
    await placeOrder(order);
  } finally {
    paying = false;
    payButton.disabled = false;
  }
  await refreshOrderCount();
}

async function placeOrder(order) {
  const operation = purchase(order, true);
  const digest = await operation.digest();
  const click = ++clicks;
  show("sending", `Paying… (key ${digest}…)`);
  try {
    const reply = await client.send(operation, {
      url: "/api/v1/orders",
      json: order,
      onAttempt: (report) => addAttempt(click, digest, report),
    });
    const placed = reply.json();
    show(
      "paid",
      `Order ${placed.order_id} is ${placed.status}` +
        (reply.replayed ? " (the server's stored outcome, replayed)" : "") +
        ` after ${reply.attempts} attempt${reply.attempts === 1 ? "" : "s"}.`,
      { orderId: placed.order_id, replayed: reply.replayed },
    );
  } catch (error) {
    if (error instanceof IdemgateError && error.mayHaveRun) {
      // Never "not paid" here: it may have gone through. The key stays with the
      // cart, so the next click asks for the same purchase's outcome.
      show("unknown", `Not confirmed yet (${error.message}). Click "Pay" again to check: you will not be charged twice.`);
    } else {
      forgetPurchase(order); // nothing happened: the next click is a new purchase
      show("failed", `Not paid: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
}

payButton.addEventListener("click", pay);
$("#new-order").addEventListener("click", () => {
  forgetPurchase(cartOrder());
  attemptsBody.replaceChildren();
  clicks = 0;
  show("idle", "Nothing paid yet.");
});
for (const input of document.querySelectorAll("#cart input")) input.addEventListener("input", showTotal);
$("#who").textContent = `Bearer ${token.slice(0, 13)}…`;
showTotal();
await refreshOrderCount();
payButton.disabled = false;
document.body.dataset.ready = "true";
