//! A small key-value service whose requests are gated by Tollgate.
//!
//! Simulated users send a mix of reads and writes to an in-memory store.
//! Every batch waits on the pod's local bucket for what it costs before it
//! runs (writes in full, reads their fixed part) and is charged for the
//! bytes it read afterwards; the CPU the service used is charged every
//! second. Once a second it prints what it served.
//!
//! ```sh
//! cargo run --release -p tollgate -- serve --in-memory &
//! cargo run --release -p tollgate -- tenant set-limits --tenant demo \
//!     --available 2000 --refill-rate 500 --burst-limit 2000
//! cargo run --release -p tollgate-client --example kv_service -- --tenant demo
//! ```
//!
//! Served request units settle at the tenant's refill rate once its burst is
//! spent; stop the server and the service keeps going at the fallback rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use tollgate_client::{Controller, Options, Registry, Request};

#[derive(Debug, Parser)]
struct Args {
    /// The Tollgate server.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    /// The tenant this service runs for.
    #[arg(long, default_value = "demo")]
    tenant: String,
    /// This pod's instance id within the tenant (1 or more).
    #[arg(long, default_value_t = 1)]
    instance: u32,
    /// Simulated users sending requests concurrently.
    #[arg(long, default_value_t = 8)]
    users: usize,
    /// How long to run, seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
}

#[derive(Debug, Default)]
struct Kv {
    data: Mutex<HashMap<u64, Vec<u8>>>,
    served: AtomicU64,
}

impl Kv {
    fn put(&self, key: u64, value: Vec<u8>) {
        let mut data = self.data.lock().unwrap_or_else(|p| p.into_inner());
        data.insert(key, value);
    }

    fn get(&self, key: u64) -> usize {
        let data = self.data.lock().unwrap_or_else(|p| p.into_inner());
        data.get(&key).map_or(0, Vec::len)
    }
}

/// One user: reads three times as often as it writes.
async fn user(kv: Arc<Kv>, controller: Controller) -> Result<(), tollgate_client::ClientError> {
    loop {
        let key = rand::random_range(0..1000u64);
        if rand::random_bool(0.25) {
            let value = vec![0u8; rand::random_range(64..4096)];
            let batch = Request::write(1, value.len() as u64);
            controller.on_request(&batch).await?;
            kv.put(key, value);
            controller.on_response(&batch, 0)?;
        } else {
            let batch = Request::read(1);
            controller.on_request(&batch).await?;
            let read = kv.get(key);
            controller.on_response(&batch, read as u64)?;
        }
        kv.served.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The client says through `tracing` when the server does not answer:
    // show its warnings unless RUST_LOG says otherwise.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    let registry = Registry::new();
    let options = Options {
        registry: Some(registry.clone()),
        ..Options::default()
    };
    let controller = Controller::connect(&args.server, &args.tenant, args.instance, options)?;
    let kv = Arc::new(Kv::default());
    let users: Vec<_> = (0..args.users)
        .map(|_| tokio::spawn(user(Arc::clone(&kv), controller.clone())))
        .collect();

    let mut last_served = 0;
    let mut last_charged = 0.0;
    for second in 1..=args.seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Some CPU went into serving; charge it after the fact.
        controller.record_cpu(0.01)?;
        let served = kv.served.load(Ordering::Relaxed);
        let status = controller.status();
        println!(
            "{second:>3}s  {:>6} req/s  {:>8.1} RU/s  waiting {:>2}  fallback {}",
            served - last_served,
            status.charged_tokens - last_charged,
            status.waiters,
            if status.fallback_active { "on" } else { "off" },
        );
        last_served = served;
        last_charged = status.charged_tokens;
    }

    let report = controller.shutdown().await;
    for user in users {
        user.abort();
    }
    println!(
        "served {} requests, charged {:.1} RU, reported to the server: {}",
        kv.served.load(Ordering::Relaxed),
        report.status.charged_tokens,
        report.consumption_reported
    );
    if !report.consumption_reported {
        // The work ran on the initial allowance and the fallback rate; its
        // consumption never reached the server, so nothing was billed.
        anyhow::bail!(
            "the server at {} did not take the final consumption report: is `tollgate serve` running there (--server)?",
            args.server
        );
    }
    Ok(())
}
