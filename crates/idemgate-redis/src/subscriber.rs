//! The pub/sub listener: other instances' completions as wake-up hints.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;
use idemgate_core::scope::IdentityDigest;
use idemgate_core::signals::ChangeSignals;
use tokio::sync::watch;

/// The pause before subscribing again after the subscription failed or ended.
const RESUBSCRIBE_DELAY: Duration = Duration::from_secs(1);

/// Subscribes to `channel` and wakes local waiters for every digest announced on it,
/// until the store (which owns `signals`) is gone. On any failure it waits a moment
/// and subscribes again through the next client in `clients` (cluster nodes, in
/// turn): `PUBLISH` reaches every node of a cluster, so any one will do.
///
/// `subscribed` is `true` while the subscription is confirmed: a waiter marks a
/// record (so its completion is announced) only once it would hear the
/// announcement.
///
/// A hint only: while unsubscribed, waiters fall back to their timeouts.
pub(crate) async fn run(
    clients: Vec<redis::Client>,
    channel: String,
    signals: Weak<ChangeSignals>,
    subscribed: watch::Sender<bool>,
    connect_timeout: Duration,
) {
    for client in clients.iter().cycle() {
        let subscribing = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(connect_timeout * 2, subscribing).await {
            Ok(Ok(pubsub)) => {
                subscribed.send_replace(true);
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    let Some(signals) = signals.upgrade() else {
                        return;
                    };
                    if let Ok(digest) = <[u8; 32]>::try_from(message.get_payload_bytes()) {
                        signals.notify(&IdentityDigest::from_bytes(digest));
                    }
                }
                subscribed.send_replace(false);
                tracing::debug!("Redis change subscription ended; subscribing again");
            }
            Ok(Err(err)) => tracing::debug!(error = %err, "could not subscribe to Redis changes"),
            Err(_) => tracing::debug!("subscribing to Redis changes timed out"),
        }
        if signals.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(RESUBSCRIBE_DELAY).await;
    }
}
