//! Rate-limited actions per tenant, set by tiers.
//!
//! A SaaS lets tenants schedule bulk email sends and generate AI summaries
//! of documents, and limits each action per tenant by the tenant's plan.
//! This example puts tiers `pro` and `free` on a Tollgate server, onboards
//! tenant `t1234` on `pro` (which provisions its `schedule-email` and
//! `invoke-doc-summary-ai` buckets), and runs a worker that claims 50
//! tokens for each bulk send. Halfway through, the tenant moves to `free`:
//! the worker, still running, slows to the free rate.
//!
//! ```sh
//! cargo run --release -p tollgate -- serve --in-memory &
//! cargo run --release -p tollgate-client --example tiers
//! ```
//!
//! The same tiers as a file for `tollgate tier apply -f`:
//!
//! ```toml
//! [tiers.pro.buckets.schedule-email]
//! refill_rate = 100
//! burst_limit = 200
//! [tiers.pro.buckets.invoke-doc-summary-ai]
//! refill_rate = 5
//! burst_limit = 20
//! [tiers.free.buckets.schedule-email]
//! refill_rate = 20
//! burst_limit = 50
//! ```

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tollgate_client::{Controller, LocalBucketConfig, Options};
use tollgate_proto::v1::{self, admin_client::AdminClient};

#[derive(Debug, Parser)]
struct Args {
    /// The Tollgate server.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    /// The tenant to onboard.
    #[arg(long, default_value = "t1234")]
    tenant: String,
    /// How long the worker runs on each tier, seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds_per_tier: f64,
}

/// Tokens one bulk email send claims.
const BULK_SEND: f64 = 50.0;

fn bucket(name: &str, refill_rate: f64, burst_limit: f64) -> v1::BucketDefinition {
    v1::BucketDefinition {
        bucket: name.into(),
        refill_rate,
        burst_limit,
        initial_tokens: None,
        kind: v1::BucketKind::Shared.into(),
    }
}

fn tier(name: &str, buckets: Vec<v1::BucketDefinition>) -> v1::PutTierRequest {
    v1::PutTierRequest {
        tier: Some(v1::Tier {
            name: name.into(),
            buckets,
            ..v1::Tier::default()
        }),
        dry_run: false,
    }
}

/// Bulk sends per second on each tier.
#[derive(Debug)]
struct Rates {
    pro: f64,
    free: f64,
}

async fn run(args: &Args) -> anyhow::Result<Rates> {
    let mut admin = AdminClient::connect(args.server.clone())
        .await
        .with_context(|| format!("connect to {}", args.server))?;
    admin
        .put_tier(tier(
            "pro",
            vec![
                bucket("schedule-email", 100.0, 200.0),
                bucket("invoke-doc-summary-ai", 5.0, 20.0),
            ],
        ))
        .await?;
    admin
        .put_tier(tier("free", vec![bucket("schedule-email", 20.0, 50.0)]))
        .await?;
    // Onboarding provisions every bucket of the tier; running the example
    // again puts the tenant back on pro instead.
    let onboarded = admin
        .set_tenant_tier(v1::SetTenantTierRequest {
            tenant_id: args.tenant.clone(),
            tier: "pro".into(),
            dry_run: false,
        })
        .await?
        .into_inner();
    let buckets: Vec<_> = onboarded
        .tenant
        .iter()
        .flat_map(|t| &t.buckets)
        .map(|b| b.bucket.as_str())
        .collect();
    println!("{} is on pro with buckets {buckets:?}", args.tenant);

    // One controller per pod serves every bucket it uses. A small initial
    // allowance makes the tier's rate visible at once.
    let options = Options {
        bucket: LocalBucketConfig {
            initial_tokens: BULK_SEND,
            target_request_period: Duration::from_secs(1),
            ..LocalBucketConfig::default()
        },
        ..Options::default()
    };
    let controller = Controller::connect(&args.server, &args.tenant, 1, options)?;
    let emails = controller.bucket("schedule-email")?;
    let summaries = controller.bucket("invoke-doc-summary-ai")?;
    summaries.acquire(1.0).await?;
    println!("summarised a document");

    let phase = Duration::from_secs_f64(args.seconds_per_tier);
    let pro = sends_for(&emails, phase).await?;
    println!("pro:  {pro:.2} bulk sends/s");
    admin
        .set_tenant_tier(v1::SetTenantTierRequest {
            tenant_id: args.tenant.clone(),
            tier: "free".into(),
            dry_run: false,
        })
        .await?;
    println!("{} moved to free", args.tenant);
    let free = sends_for(&emails, phase).await?;
    println!("free: {free:.2} bulk sends/s");
    controller.shutdown().await;
    Ok(Rates { pro, free })
}

/// Bulk sends per second a worker manages for `phase`, claiming 50 tokens
/// for each.
async fn sends_for(emails: &tollgate_client::BucketHandle, phase: Duration) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut sends = 0u32;
    while start.elapsed() < phase {
        match tokio::time::timeout(phase - start.elapsed(), emails.acquire(BULK_SEND)).await {
            Ok(claimed) => {
                claimed?;
                sends += 1;
            }
            Err(_) => break,
        }
    }
    Ok(f64::from(sends) / start.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rates = run(&args).await?;
    anyhow::ensure!(
        rates.free < rates.pro,
        "the free tier should be slower than pro: {rates:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_server::store::{BucketSettings, EmbeddedStore, Store};

    use super::*;

    /// The example against an in-process server: pro allows 2 bulk sends a
    /// second (100 tokens/s), free 0.4 (20 tokens/s).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tier_switch_slows_the_running_worker() {
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::in_memory(BucketSettings::default()).expect("in-memory store"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let server = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(tollgate_server::run(
            listener,
            store,
            std::future::pending(),
        ));
        let args = Args {
            server,
            tenant: "t1234".into(),
            seconds_per_tier: 6.0,
        };
        let rates = run(&args).await.expect("example runs");
        // Bursts make short windows generous; the long-run rates are 2 and
        // 0.4 sends a second.
        assert!(rates.pro > 1.5 && rates.pro < 6.0, "{rates:?}");
        assert!(rates.free < 1.5, "{rates:?}");
        assert!(rates.free < rates.pro / 2.0, "{rates:?}");
    }
}
