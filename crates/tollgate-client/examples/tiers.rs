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
//! It talks to a server of its own, beside the quick start's (which holds
//! port 50051 and the metrics port):
//!
//! ```sh
//! cargo run --release -p tollgate -- serve --in-memory --listen 127.0.0.1:50052 --metrics-listen off &
//! cargo run --release -p tollgate-client --example tiers -- --server http://127.0.0.1:50052
//! ```
//!
//! Tiers `pro` or `free` that already exist on the server with other
//! buckets are left alone and the example stops, unless run with
//! `--overwrite-tiers`. Its test runs it against an in-process server.
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
    /// The Tollgate server: a scratch one, not the quick start's.
    #[arg(long, default_value = "http://127.0.0.1:50052")]
    server: String,
    /// Replace tiers `pro` and `free` if the server has them with other
    /// buckets (every tenant on them gets the example's limits).
    #[arg(long)]
    overwrite_tiers: bool,
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
        quota: None,
        bucket: name.into(),
        refill_rate,
        burst_limit,
        initial_tokens: None,
        kind: v1::BucketKind::Shared.into(),
        enforce: None,
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

/// Stops unless tier `wanted` is missing from the server, already as
/// wanted, or `overwrite` is set: putting a tier rewrites the buckets of
/// every tenant on it, and a server the example reaches by mistake may
/// have real tenants on `pro`.
async fn refuse_to_overwrite(
    admin: &mut AdminClient<tonic::transport::Channel>,
    wanted: &v1::PutTierRequest,
    overwrite: bool,
) -> anyhow::Result<()> {
    let Some(wanted) = &wanted.tier else {
        return Ok(());
    };
    let existing = match admin
        .get_tier(v1::GetTierRequest {
            name: wanted.name.clone(),
        })
        .await
    {
        Ok(answer) => answer.into_inner().tier.unwrap_or_default(),
        Err(status) if status.code() == tonic::Code::NotFound => return Ok(()),
        Err(status) => return Err(status).context(format!("read tier {}", wanted.name)),
    };
    let by_name = |tier: &v1::Tier| {
        let mut buckets = tier.buckets.clone();
        buckets.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        buckets
    };
    if overwrite || (by_name(&existing) == by_name(wanted) && existing.tables.is_empty()) {
        return Ok(());
    }
    anyhow::bail!(
        "tier {} already exists on this server with other buckets; not overwriting it \
         (its tenants would get this example's limits): run the example against a scratch \
         server (--server), or pass --overwrite-tiers",
        wanted.name
    )
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
    let tiers = [
        tier(
            "pro",
            vec![
                bucket("invoke-doc-summary-ai", 5.0, 20.0),
                bucket("schedule-email", 100.0, 200.0),
            ],
        ),
        tier("free", vec![bucket("schedule-email", 20.0, 50.0)]),
    ];
    for wanted in &tiers {
        refuse_to_overwrite(&mut admin, wanted, args.overwrite_tiers).await?;
    }
    for wanted in tiers {
        admin.put_tier(wanted).await?;
    }
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
            overwrite_tiers: false,
        };
        let rates = run(&args).await.expect("example runs");
        // Bursts make short windows generous; the long-run rates are 2 and
        // 0.4 sends a second.
        assert!(rates.pro > 1.5 && rates.pro < 6.0, "{rates:?}");
        assert!(rates.free < 1.5, "{rates:?}");
        assert!(rates.free < rates.pro / 2.0, "{rates:?}");
    }

    /// A server whose `pro` tier is not the example's keeps it: the example
    /// stops before changing anything, and replaces it only when asked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn existing_tiers_are_not_overwritten_unless_asked() {
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
        let mut admin = AdminClient::connect(server.clone()).await.expect("connect");
        let theirs = vec![bucket("schedule-email", 7.0, 70.0)];
        admin
            .put_tier(tier("pro", theirs.clone()))
            .await
            .expect("their pro tier");
        let mut args = Args {
            server,
            tenant: "t1234".into(),
            seconds_per_tier: 0.5,
            overwrite_tiers: false,
        };
        let refused = run(&args).await.expect_err("pro is theirs");
        assert!(
            refused.to_string().contains("tier pro already exists")
                && refused.to_string().contains("--overwrite-tiers"),
            "{refused:#}"
        );
        let kept = |admin: &mut AdminClient<tonic::transport::Channel>, name: &'static str| {
            let mut admin = admin.clone();
            async move {
                admin
                    .get_tier(v1::GetTierRequest { name: name.into() })
                    .await
                    .map(|t| t.into_inner().tier.unwrap_or_default().buckets)
            }
        };
        assert_eq!(kept(&mut admin, "pro").await.expect("pro"), theirs);
        assert_eq!(
            kept(&mut admin, "free")
                .await
                .expect_err("free not created")
                .code(),
            tonic::Code::NotFound
        );
        assert!(
            admin
                .describe_tenant(v1::DescribeTenantRequest {
                    tenant_id: "t1234".into()
                })
                .await
                .is_err(),
            "no tenant onboarded"
        );

        args.overwrite_tiers = true;
        run(&args).await.expect("asked to overwrite");
        let pro = kept(&mut admin, "pro").await.expect("pro");
        assert!(
            pro.iter()
                .any(|b| b.bucket == "schedule-email" && b.refill_rate == 100.0),
            "{pro:?}"
        );
    }
}
