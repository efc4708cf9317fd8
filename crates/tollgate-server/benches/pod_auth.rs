//! What checking a pod's credentials costs a call: a pod token looked up
//! in a file of 8 tokens and of one per tenant at 100 000 tenants, the
//! tenants of a client certificate read from its DER, and the whole
//! file parsed again (a reload). Printed beside them in the same run: a
//! call with no credentials configured, the baseline.
//!
//! Run: `cargo bench -p tollgate-server --bench pod_auth`

use std::hint::black_box;
use std::sync::Arc;

use arc_swap::ArcSwap;
use criterion::{Criterion, criterion_group, criterion_main};
use tollgate_core::TenantId;
use tollgate_server::service::PodAuth;
use tollgate_server::service::PodTokens;
use tollgate_server::service::pod_auth::certificate_tenants;

/// A tokens file of `tenants` lines, one token per tenant.
fn tokens_file(tenants: usize) -> String {
    (0..tenants)
        .map(|i| format!("pods-{i} token-{i:016}-0123456789 tenant-{i}\n"))
        .collect()
}

fn call(token: Option<&str>) -> tonic::Request<()> {
    let mut request = tonic::Request::new(());
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    request
}

fn check(c: &mut Criterion) {
    let tenant = TenantId::parse("tenant", "tenant-7").expect("valid");
    let open = PodAuth::default();
    let anonymous = call(None);
    c.bench_function("pod auth: none configured", |b| {
        b.iter(|| {
            let caller = open.caller(black_box(&anonymous)).expect("open");
            open.authorize(&caller, "TokenBucket", [&tenant])
                .expect("open")
        })
    });
    for tenants in [8_usize, 100_000] {
        let file = tokens_file(tenants);
        let tokens = PodTokens::parse(&file).expect("valid file");
        let auth = PodAuth::new(Some(Arc::new(ArcSwap::from_pointee(tokens))), false);
        let presented = call(Some("token-0000000000000007-0123456789"));
        c.bench_function(&format!("pod auth: token among {tenants}"), |b| {
            b.iter(|| {
                let caller = auth.caller(black_box(&presented)).expect("known token");
                auth.authorize(&caller, "TokenBucket", [&tenant])
                    .expect("its tenant")
            })
        });
    }
    let file = tokens_file(100_000);
    c.bench_function("pod tokens file of 100 000 lines: parse", |b| {
        b.iter(|| PodTokens::parse(black_box(&file)).expect("valid"))
    });

    let mut params = rcgen::CertificateParams::new(vec!["pod.test".to_owned()]).expect("params");
    params.subject_alt_names.push(rcgen::SanType::URI(
        "tollgate://tenant/tenant-7".try_into().expect("ia5"),
    ));
    let key = rcgen::KeyPair::generate().expect("key");
    let der = params
        .self_signed(&key)
        .expect("certificate")
        .der()
        .to_vec();
    c.bench_function("client certificate: tenants from DER", |b| {
        b.iter(|| certificate_tenants(black_box(&der)).expect("readable"))
    });
}

criterion_group!(benches, check);
criterion_main!(benches);
