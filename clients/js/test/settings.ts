// The retry-policy settings of the shared case files (clients/retry-rules.json,
// clients/scenarios.json: snake_case, times in milliseconds) as this package's.

import { retryPolicy, type RetryPolicy } from "../src/index.js";

const SETTINGS: Record<string, keyof RetryPolicy> = {
  max_retries: "maxRetries",
  min_backoff_ms: "minBackoffMs",
  max_backoff_ms: "maxBackoffMs",
  max_retry_after_ms: "maxRetryAfterMs",
  deadline_ms: "deadlineMs",
  attempt_timeout_ms: "attemptTimeoutMs",
};

/** Every setting name the files use. */
export const SETTING_NAMES: readonly string[] = Object.keys(SETTINGS);

/** The policy `settings` make (checked by `retryPolicy`, which throws a RangeError). */
export function policyOf(settings: Record<string, number>): RetryPolicy {
  const changes: Partial<Record<keyof RetryPolicy, number>> = {};
  for (const [name, value] of Object.entries(settings)) {
    const ours = SETTINGS[name];
    if (ours === undefined) throw new Error(`unknown retry policy setting in a case file: ${name}`);
    changes[ours] = value;
  }
  return retryPolicy(changes);
}
