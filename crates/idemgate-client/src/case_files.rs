//! The retry-policy settings of this repository's shared case files
//! (`clients/retry-rules.json`, `clients/scenarios.json`) as a [`RetryPolicy`],
//! for the test suites that load those files: this crate's own and the server's
//! end-to-end suite. clients/js (`test/settings.ts`) and clients/python
//! (`policy_of` in `tests/conftest.py`) read the same settings their way.
//!
//! Built for this crate's tests and with the `case-files` feature; applications
//! build a [`RetryPolicy`] with its methods instead.

use std::time::Duration;

use serde::Deserialize;

use crate::RetryPolicy;

/// A policy's settings as the files write them (snake_case, times in
/// milliseconds): numbers, which a client with looser types than `u32` and
/// `Duration` must check. A setting the files use that this type does not know
/// fails the file's loading.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    /// [`RetryPolicy::max_retries`].
    pub max_retries: Option<f64>,
    /// The lower bound of [`RetryPolicy::backoff`].
    pub min_backoff_ms: Option<f64>,
    /// The upper bound of [`RetryPolicy::backoff`].
    pub max_backoff_ms: Option<f64>,
    /// [`RetryPolicy::max_retry_after`].
    pub max_retry_after_ms: Option<f64>,
    /// [`RetryPolicy::deadline`].
    pub deadline_ms: Option<f64>,
    /// [`RetryPolicy::attempt_timeout`].
    pub attempt_timeout_ms: Option<f64>,
}

impl PolicySettings {
    /// The default policy with these settings, or `None` for settings
    /// `RetryPolicy`'s types cannot hold (a negative or fractional count, a
    /// negative time): the cases the other clients must refuse at run time.
    pub fn policy(&self) -> Option<RetryPolicy> {
        fn millis(value: Option<f64>) -> Option<Option<Duration>> {
            match value {
                None => Some(None),
                Some(ms) if ms >= 0.0 && ms.fract() == 0.0 => {
                    Some(Some(Duration::from_millis(ms as u64)))
                }
                Some(_) => None,
            }
        }
        let mut policy = RetryPolicy::default();
        if let Some(retries) = self.max_retries {
            if !(retries >= 0.0 && retries.fract() == 0.0 && retries <= f64::from(u32::MAX)) {
                return None;
            }
            policy = policy.max_retries(retries as u32);
        }
        let (min, max) = policy.backoff_bounds();
        let (new_min, new_max) = (millis(self.min_backoff_ms)?, millis(self.max_backoff_ms)?);
        policy = policy.backoff(new_min.unwrap_or(min), new_max.unwrap_or(max));
        if let Some(cap) = millis(self.max_retry_after_ms)? {
            policy = policy.max_retry_after(cap);
        }
        if let Some(deadline) = millis(self.deadline_ms)? {
            policy = policy.deadline(deadline);
        }
        if let Some(timeout) = millis(self.attempt_timeout_ms)? {
            policy = policy.attempt_timeout(timeout);
        }
        Some(policy)
    }

    /// These settings with `over`'s laid over them: the settings `over` has are
    /// its, the others these (`{...base, ...over}`).
    pub fn overlaid(&self, over: &Self) -> Self {
        Self {
            max_retries: over.max_retries.or(self.max_retries),
            min_backoff_ms: over.min_backoff_ms.or(self.min_backoff_ms),
            max_backoff_ms: over.max_backoff_ms.or(self.max_backoff_ms),
            max_retry_after_ms: over.max_retry_after_ms.or(self.max_retry_after_ms),
            deadline_ms: over.deadline_ms.or(self.deadline_ms),
            attempt_timeout_ms: over.attempt_timeout_ms.or(self.attempt_timeout_ms),
        }
    }
}
