//! Reading server settings with `CONFIG GET`, on the one server or on every primary
//! of a cluster: what the startup checks (eviction, persistence) look at.

use std::collections::HashMap;

use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{RedisResult, Value};

use crate::codec::{array_of, bytes_of};
use crate::connection::Connection;

/// One node's answer to `CONFIG GET <names…>`: name → value, or `None` when the
/// node refused or failed (`CONFIG` disabled on managed services, ACLs).
pub(crate) type NodeConfig = Option<HashMap<String, String>>;

/// Reads `names` from the server, or from every primary of a cluster (one entry
/// per node).
pub(crate) async fn read(connection: &Connection, names: &[&str]) -> Vec<NodeConfig> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(names);
    let replies: Vec<RedisResult<Value>> = match connection {
        Connection::Standalone(manager) => vec![cmd.query_async(&mut manager.clone()).await],
        Connection::Cluster(cluster) => {
            let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            match cluster.connection().route_command(cmd, routing).await {
                // One (node address, reply) pair per primary.
                Ok(Value::Map(per_node)) => {
                    per_node.into_iter().map(|(_, reply)| Ok(reply)).collect()
                }
                other => vec![other],
            }
        }
    };
    replies
        .into_iter()
        .map(|reply| reply.ok().and_then(settings_of))
        .collect()
}

/// The pairs of a `CONFIG GET` reply: `[name, value, …]`, or a map.
fn settings_of(reply: Value) -> Option<HashMap<String, String>> {
    if let Value::ServerError(_) = reply {
        return None;
    }
    let mut settings = HashMap::new();
    let mut items = array_of(reply).ok()?.into_iter();
    while let (Some(name), Some(value)) = (items.next(), items.next()) {
        let text = |value: Value| String::from_utf8(bytes_of(value).ok()?).ok();
        settings.insert(text(name)?, text(value)?);
    }
    Some(settings)
}
