//! nginx's worker model for one public listener: a thread per worker, each with
//! its own current-thread runtime and its own `SO_REUSEPORT` listener
//! ([`Listener::bind_group`]). A connection is accepted, read, answered — and
//! whatever it spawns (the idempotency layer's detached handler, the upstream
//! client's connection tasks) runs — on the thread that accepted it, so a
//! request costs no wake-up of another thread. What must be one for the whole
//! process (the store, the replay cache, the connection bound) is shared; the
//! rest is per worker.
//!
//! The workers outlive their listeners: after a drain they keep their runtimes
//! turning until [`Workers::release`], so the tasks still settling records (and
//! store connections a worker's runtime opened for others) finish first.

use tokio::sync::{oneshot, watch};

use crate::{HttpService, Listener};

/// The worker threads serving one listener group.
#[derive(Debug)]
pub struct Workers {
    /// One per worker: resolves once its listener has closed every connection.
    drained: Vec<oneshot::Receiver<()>>,
    /// One per worker: resolves once its runtime has stopped.
    exited: Vec<oneshot::Receiver<()>>,
    release: watch::Sender<bool>,
}

impl Workers {
    /// Starts one thread per listener, each serving `service` on its own
    /// current-thread runtime until `stop` turns true.
    pub fn start(
        listeners: Vec<Listener>,
        service: impl HttpService,
        stop: watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let (release, released) = watch::channel(false);
        let mut drained = Vec::with_capacity(listeners.len());
        let mut exited = Vec::with_capacity(listeners.len());
        for (index, listener) in listeners.into_iter().enumerate() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (drained_tx, drained_rx) = oneshot::channel();
            let (exited_tx, exited_rx) = oneshot::channel();
            let service = service.clone();
            let stop = stop.clone();
            let released = released.clone();
            std::thread::Builder::new()
                // Linux keeps 15 bytes of a thread's name: `worker-N` shows whole
                // in top and /proc.
                .name(format!("worker-{index}"))
                .spawn(move || {
                    runtime.block_on(serve(listener, service, stop, released, drained_tx));
                    // Dropping the runtime cancels what is left: only past the
                    // shutdown deadline is anything left.
                    drop(runtime);
                    let _ = exited_tx.send(());
                })?;
            drained.push(drained_rx);
            exited.push(exited_rx);
        }
        Ok(Self {
            drained,
            exited,
            release,
        })
    }

    /// Resolves once every worker's listener has stopped accepting and closed
    /// its connections (after `stop`).
    pub async fn drained(&mut self) {
        for drained in &mut self.drained {
            let _ = drained.await;
        }
    }

    /// Lets the workers' runtimes stop — whatever still runs on them is
    /// cancelled — and waits until they have.
    pub async fn release(self) {
        let _ = self.release.send(true);
        for exited in self.exited {
            let _ = exited.await;
        }
    }
}

/// One worker: serve until `stop`, say so, and keep the runtime turning until
/// released (or released early, past the shutdown deadline).
async fn serve(
    listener: Listener,
    service: impl HttpService,
    mut stop: watch::Receiver<bool>,
    mut released: watch::Receiver<bool>,
    drained: oneshot::Sender<()>,
) {
    let serve = listener.serve(service, async move {
        let _ = stop.wait_for(|stop| *stop).await;
    });
    let served = tokio::select! {
        () = serve => true,
        _ = released.wait_for(|released| *released) => false,
    };
    if served {
        let _ = drained.send(());
        let _ = released.wait_for(|released| *released).await;
    }
}
