//! The pub/sub listener: other instances' completions as wake-up hints.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;
use idemgate_core::scope::IdentityDigest;
use idemgate_core::signals::ChangeSignals;

/// The pause before subscribing again after the subscription failed or ended.
const RESUBSCRIBE_DELAY: Duration = Duration::from_secs(1);

/// Subscribes to `channel` and wakes local waiters for every digest announced on it,
/// until the store (which owns `signals`) is gone. On any failure it waits a moment
/// and subscribes again through the next client in `clients` (cluster nodes, in
/// turn): `PUBLISH` reaches every node of a cluster, so any one will do.
///
/// A hint only: while unsubscribed, waiters fall back to their timeouts.
pub(crate) async fn run(
    clients: Vec<redis::Client>,
    channel: String,
    signals: Weak<ChangeSignals>,
    connect_timeout: Duration,
) {
    for client in clients.iter().cycle() {
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(connect_timeout * 2, subscribed).await {
            Ok(Ok(pubsub)) => {
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    let Some(signals) = signals.upgrade() else {
                        return;
                    };
                    if let Ok(digest) = <[u8; 32]>::try_from(message.get_payload_bytes()) {
                        signals.notify(&IdentityDigest::from_bytes(digest));
                    }
                }
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
