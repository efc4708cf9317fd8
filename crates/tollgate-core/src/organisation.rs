//! Organisations: how a parent bucket's refill is shared by its children.
//!
//! An organisation owns tenants (and other organisations) and has buckets
//! of its own. For each bucket name it limits, its children's buckets of
//! that name draw their refill from its bucket, as pods draw theirs from a
//! tenant's bucket: once per target period each child asks for the rate it
//! wants, and the parent answers the rate it may have until the next
//! period. This module is the parent's rule for those answers, in the
//! manner of Linux's HTB and YARN's hierarchical queues:
//!
//! 1. **Guarantees first.** Each child gets its guaranteed rate, or what
//!    it wants if that is less (a guarantee is reserved only while its
//!    child wants it). If the guarantees wanted exceed the parent's rate,
//!    they are cut in proportion.
//! 2. **Borrowing by shares.** What is left goes to the children that want
//!    more, in proportion to their shares, each up to the least of what it
//!    wants and its ceiling (its own limits); what one cannot take is
//!    offered again to the others (water-filling), so no capacity stays
//!    idle while a child below its ceiling wants more.
//! 3. **Ceilings always.** No child gets more than its ceiling, nor more
//!    than it wants.
//!
//! [`allocate`] is a pure function of the parent's rate and the children's
//! asks; the properties above are checked by property tests. How the asks
//! are carried and the answers kept (a child's row draws on its parent's
//! once per period, never per pod request) is the grant protocol of the
//! global bucket, one level up.
//!
//! # The tree
//!
//! An organisation is an id in the tenants' namespace: its buckets are
//! kept, limited, budgeted and listed like any tenant's, but no pod draws
//! on them directly ([`Node`]). Each member (a tenant, or an organisation
//! nested at most [`MAX_DEPTH`] deep) has an id in its organisation's
//! buckets (`member_id`, an instance id that is never reused) and may have
//! a guaranteed rate per bucket name. The tree's rules are [`create`],
//! [`join`], [`leave`] and [`delete`]: pure functions of the rows they
//! change, which stores lock, read and write.
//!
//! # Draws
//!
//! A member's bucket keeps its own limits (its ceiling). For each bucket
//! name its organisation has a bucket of, it *draws* its refill from that
//! bucket once per draw period (10 s): the first pod request of the
//! member's bucket after the period is over asks the organisation's bucket
//! for what the member's pods asked for over the last period (the *wants*,
//! at most the member's own rate), as one instance of it with
//! [`global_bucket::request_guaranteed`](crate::global_bucket::request_guaranteed) (shares: the wants beyond the
//! guarantee; guaranteed: the guarantee, as far as it is wanted). The
//! member then refills at the lesser of its own rate and the rate it was
//! given, until the grant's trickle ends, and not at all after that until
//! its next draw ([`Drawn`]); tokens granted at once go into it at once.
//! So the organisation's rows are locked once per member bucket per
//! period, never per pod request, and everything its members admit
//! together comes out of its bucket, with the bound the grant protocol
//! has one level down. What a member does not use stays in (or returns
//! to) the organisation's bucket, where the next member to ask finds it:
//! that is how idle capacity is lent. The member reports its consumption
//! since its last draw with each draw, so the organisation's totals (and
//! budgets) count its members' use, one period late.
//!
//! A bucket's first draw from an organisation starts it empty (its debt
//! kept): tokens it held on its own are not carried in, so that
//! everything it hands out from then on comes out of the organisation's
//! bucket.
//!
//! A member silent for two draw periods is taken out of its
//! organisation's shares ([`parent_config`]). Until then, what it does not
//! use waits in the organisation's bucket, up to its burst limit, for the
//! next member that asks: an organisation whose burst holds a period of
//! its refill lends all of it.
//!
//! A bucket name the organisation has no bucket for is not limited by it
//! (the member runs on its own limits and looks again a period later). A
//! member that leaves runs on its own limits from its next request on.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::consumption::Consumption;
use crate::global_bucket::{BucketRow, GlobalBucketConfig, Grant, InstanceId, TokenBucketRequest};
use crate::time::Timestamp;
use crate::validate::{self, BucketKey, BucketName, InvalidInput, MAX_REFILL_RATE, TenantId};

/// The most organisations above a tenant: a tenant's organisation, its
/// organisation's, and so on, at most this many.
pub const MAX_DEPTH: usize = 4;

/// The longest display name of an organisation, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// How often a member bucket draws from its organisation by default.
pub const DEFAULT_DRAW_PERIOD: Duration = Duration::from_secs(10);

/// The shortest period a draw asks for: with a draw period below it (0
/// draws on every request), each draw still asks for a second of what
/// the member wants.
const MIN_ASK_PERIOD: Duration = Duration::from_secs(1);

/// The period a draw asks for.
fn ask_period(draw_period: Duration) -> Duration {
    draw_period.max(MIN_ASK_PERIOD)
}

/// Where an id stands in the tree: one row per id that is an organisation
/// or a member of one (or both).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Set if this id is an organisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub organisation: Option<Organisation>,
    /// Set if it belongs to an organisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_of: Option<Member>,
}

impl Node {
    /// True if nothing is left in the row (it can be deleted).
    pub fn is_empty(&self) -> bool {
        self.organisation.is_none() && self.member_of.is_none()
    }
}

/// An organisation's own part of its row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Organisation {
    /// What operators call it (may be empty).
    pub display_name: String,
    pub created_at: Timestamp,
    /// The member id the next member gets: ids are never reused, so a
    /// member that leaves and comes back is a new instance of the
    /// organisation's buckets.
    pub next_member_id: InstanceId,
}

/// A member's link to its organisation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub organisation: TenantId,
    /// Its instance id in the organisation's buckets.
    pub member_id: InstanceId,
    /// Rates reserved for it, per bucket name, while it wants them.
    #[serde(default)]
    pub guaranteed: BTreeMap<BucketName, f64>,
    pub since: Timestamp,
}

impl Member {
    /// The rate reserved for its bucket `bucket`.
    pub fn guaranteed_rate(&self, bucket: &BucketName) -> f64 {
        self.guaranteed.get(bucket).copied().unwrap_or(0.0)
    }
}

/// Why a change of the tree was refused; nothing changed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TreeError {
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    #[error("organisation \"{0}\" does not exist")]
    NoSuchOrganisation(TenantId),
    #[error("\"{0}\" is already an organisation")]
    AlreadyAnOrganisation(TenantId),
    #[error(
        "\"{0}\" has buckets of its own: an organisation needs an id no tenant uses (its buckets are made by setting its limits once it exists)"
    )]
    TenantHasBuckets(TenantId),
    #[error("\"{member}\" belongs to organisation \"{organisation}\"; remove it from there first")]
    MemberElsewhere {
        member: TenantId,
        organisation: TenantId,
    },
    #[error("\"{0}\" belongs to no organisation")]
    NotAMember(TenantId),
    #[error(
        "\"{member}\" cannot join \"{organisation}\": \"{organisation}\" is \"{member}\" or lies below it"
    )]
    Cycle {
        member: TenantId,
        organisation: TenantId,
    },
    #[error(
        "\"{member}\" cannot join \"{organisation}\": that would put {depth} organisations above a tenant, and at most {MAX_DEPTH} may be"
    )]
    TooDeep {
        member: TenantId,
        organisation: TenantId,
        depth: usize,
    },
    #[error("organisation \"{organisation}\" has {members} members; remove them first")]
    HasMembers {
        organisation: TenantId,
        members: usize,
    },
    #[error("organisation \"{0}\" has no more member ids")]
    MemberIdsExhausted(TenantId),
}

/// An operator's change of the tree.
#[derive(Clone, Debug, PartialEq)]
pub enum TreeChange {
    /// Makes an id no tenant uses an organisation.
    Create {
        organisation: TenantId,
        display_name: String,
    },
    /// Puts a tenant (or an organisation) into an organisation, or sets
    /// the guarantees of one already there.
    Join {
        organisation: TenantId,
        member: TenantId,
        guaranteed: BTreeMap<BucketName, f64>,
    },
    /// Takes a member out of its organisation.
    Leave { member: TenantId },
    /// Ends an organisation without members.
    Delete { organisation: TenantId },
}

impl TreeChange {
    /// Where the rows a store reads for the change start: the chain of
    /// organisations up from the first id, and the organisations below
    /// the second (a joining member's subtree).
    pub fn reads(&self) -> (&TenantId, Option<&TenantId>) {
        match self {
            TreeChange::Create { organisation, .. } | TreeChange::Delete { organisation } => {
                (organisation, None)
            }
            TreeChange::Join {
                organisation,
                member,
                ..
            } => (organisation, Some(member)),
            TreeChange::Leave { member } => (member, None),
        }
    }
}

/// What a store read for a change: the rows of [`TreeChange::reads`] (the
/// chain up from its first id, the organisations below its second, and
/// the member's own row), whether the organisation being created has
/// buckets, and how many members the one being deleted has.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TreeRows {
    pub nodes: BTreeMap<TenantId, Node>,
    pub has_buckets: bool,
    pub members: usize,
}

/// Applies `change` to the rows read for it: the rows to write (an empty
/// row is deleted).
pub fn apply(
    change: &TreeChange,
    rows: &TreeRows,
    now: Timestamp,
) -> Result<Vec<(TenantId, Node)>, TreeError> {
    let node = |id: &TenantId| rows.nodes.get(id);
    match change {
        TreeChange::Create {
            organisation,
            display_name,
        } => {
            let row = create(
                organisation,
                node(organisation),
                rows.has_buckets,
                display_name,
                now,
            )?;
            Ok(vec![(organisation.clone(), row)])
        }
        TreeChange::Join {
            organisation,
            member,
            guaranteed,
        } => {
            let chain = chain(&rows.nodes, organisation);
            let (org_row, member_row) = join(
                (organisation, node(organisation)),
                (member, node(member)),
                &chain,
                height(&rows.nodes, member),
                guaranteed.clone(),
                now,
            )?;
            Ok(vec![
                (organisation.clone(), org_row),
                (member.clone(), member_row),
            ])
        }
        TreeChange::Leave { member } => Ok(vec![(member.clone(), leave(member, node(member))?)]),
        TreeChange::Delete { organisation } => Ok(vec![(
            organisation.clone(),
            delete(organisation, node(organisation), rows.members)?,
        )]),
    }
}

/// `from` and the organisations above it, nearest first (at most
/// `MAX_DEPTH + 1`: a longer chain is already too deep).
pub fn chain(nodes: &BTreeMap<TenantId, Node>, from: &TenantId) -> Vec<TenantId> {
    let mut chain = vec![from.clone()];
    let mut at = from;
    while let Some(up) = nodes.get(at).and_then(|n| n.member_of.as_ref()) {
        if chain.len() > MAX_DEPTH || chain.contains(&up.organisation) {
            break;
        }
        chain.push(up.organisation.clone());
        at = &up.organisation;
    }
    chain
}

/// The organisations on the longest path down from `id`, `id` included
/// if it is one (0 for a tenant).
pub fn height(nodes: &BTreeMap<TenantId, Node>, id: &TenantId) -> usize {
    fn go(nodes: &BTreeMap<TenantId, Node>, id: &TenantId, depth: usize) -> usize {
        let is_org = nodes.get(id).is_some_and(|n| n.organisation.is_some());
        if !is_org || depth > MAX_DEPTH {
            return 0;
        }
        let below = nodes
            .iter()
            .filter(|(_, n)| n.member_of.as_ref().is_some_and(|m| &m.organisation == id))
            .map(|(child, _)| go(nodes, child, depth + 1))
            .max()
            .unwrap_or(0);
        1 + below
    }
    go(nodes, id, 0)
}

/// Makes `id` an organisation. `existing` is its row, `has_buckets`
/// whether it has buckets (an id tenants' pods use cannot become one).
pub fn create(
    id: &TenantId,
    existing: Option<&Node>,
    has_buckets: bool,
    display_name: &str,
    now: Timestamp,
) -> Result<Node, TreeError> {
    if display_name.len() > MAX_NAME_LEN {
        return Err(InvalidInput::new(
            "display_name",
            format!(
                "must be at most {MAX_NAME_LEN} bytes, got {}",
                display_name.len()
            ),
        )
        .into());
    }
    if display_name.chars().any(char::is_control) {
        return Err(
            InvalidInput::new("display_name", "must not contain control characters").into(),
        );
    }
    let mut node = existing.cloned().unwrap_or_default();
    if node.organisation.is_some() {
        return Err(TreeError::AlreadyAnOrganisation(id.clone()));
    }
    if has_buckets {
        return Err(TreeError::TenantHasBuckets(id.clone()));
    }
    node.organisation = Some(Organisation {
        display_name: display_name.to_owned(),
        created_at: now,
        next_member_id: 1,
    });
    Ok(node)
}

/// Validates guaranteed rates as the wire names them.
pub fn validate_guarantees(guaranteed: &BTreeMap<BucketName, f64>) -> Result<(), InvalidInput> {
    for (bucket, rate) in guaranteed {
        validate::non_negative(
            &format!("guaranteed_rates[{:?}]", bucket.as_str()),
            *rate,
            MAX_REFILL_RATE,
        )?;
    }
    Ok(())
}

/// Puts `member` into `organisation` (or, if it is already there, sets its
/// guarantees). `chain` is the organisation and the organisations above
/// it, nearest first; `height` the number of organisations in the
/// member's own subtree on the longest path down (0 for a tenant).
/// Returns the two rows to write: the organisation's, then the member's.
pub fn join(
    organisation: (&TenantId, Option<&Node>),
    member: (&TenantId, Option<&Node>),
    chain: &[TenantId],
    height: usize,
    guaranteed: BTreeMap<BucketName, f64>,
    now: Timestamp,
) -> Result<(Node, Node), TreeError> {
    validate_guarantees(&guaranteed)?;
    let (org_id, org_node) = organisation;
    let (member_id, member_node) = member;
    let mut org_row = org_node.cloned().unwrap_or_default();
    let Some(org) = org_row.organisation.as_mut() else {
        return Err(TreeError::NoSuchOrganisation(org_id.clone()));
    };
    if org_id == member_id || chain.contains(member_id) {
        return Err(TreeError::Cycle {
            member: member_id.clone(),
            organisation: org_id.clone(),
        });
    }
    let mut member_row = member_node.cloned().unwrap_or_default();
    match &mut member_row.member_of {
        Some(link) if &link.organisation == org_id => {
            link.guaranteed = guaranteed;
            return Ok((org_row, member_row));
        }
        Some(link) => {
            return Err(TreeError::MemberElsewhere {
                member: member_id.clone(),
                organisation: link.organisation.clone(),
            });
        }
        None => {}
    }
    let depth = chain.len().max(1) + height;
    if depth > MAX_DEPTH {
        return Err(TreeError::TooDeep {
            member: member_id.clone(),
            organisation: org_id.clone(),
            depth,
        });
    }
    let id = org.next_member_id;
    org.next_member_id = id
        .checked_add(1)
        .ok_or_else(|| TreeError::MemberIdsExhausted(org_id.clone()))?;
    member_row.member_of = Some(Member {
        organisation: org_id.clone(),
        member_id: id,
        guaranteed,
        since: now,
    });
    Ok((org_row, member_row))
}

/// Takes `member` out of its organisation: its row as it stays (empty if
/// it is neither an organisation nor a member any more).
pub fn leave(member_id: &TenantId, member: Option<&Node>) -> Result<Node, TreeError> {
    let mut row = member.cloned().unwrap_or_default();
    if row.member_of.take().is_none() {
        return Err(TreeError::NotAMember(member_id.clone()));
    }
    Ok(row)
}

/// Ends an organisation that has no members: its row as it stays.
pub fn delete(id: &TenantId, node: Option<&Node>, members: usize) -> Result<Node, TreeError> {
    let mut row = node.cloned().unwrap_or_default();
    if row.organisation.is_none() {
        return Err(TreeError::NoSuchOrganisation(id.clone()));
    }
    if members > 0 {
        return Err(TreeError::HasMembers {
            organisation: id.clone(),
            members,
        });
    }
    row.organisation = None;
    Ok(row)
}

/// What a member bucket was given by its organisation: it refills at the
/// lesser of its own rate and `rate` until `until`, and not at all after
/// that until its next draw.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Drawn {
    pub rate: f64,
    pub until: Timestamp,
}

/// A member bucket's side of its draws, kept in its head row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Draw {
    /// The organisation drawn from, and this bucket's id in its bucket.
    pub organisation: TenantId,
    pub member_id: InstanceId,
    /// The last draw's sequence number.
    pub seq: u64,
    /// When the next draw is due.
    pub next: Timestamp,
    /// Tokens the bucket's pods asked for since `asked_since` (what the
    /// next draw asks for, as a rate).
    pub asked: f64,
    pub asked_since: Timestamp,
    /// The bucket's consumption totals as of the last draw: the next
    /// reports what it consumed since.
    pub reported: Consumption,
    /// Draws made, for metrics and tests (at most one per period).
    pub draws: u64,
    /// The organisation's last answer, for operators: the rate, and the
    /// tokens it granted.
    pub last_rate: f64,
    pub last_granted: f64,
    /// What the last draw asked for, tokens per second.
    pub wants: f64,
}

/// The bucket an organisation that belongs to another gets when one of
/// its members draws on a bucket name it has no bucket of: no limit of its
/// own (the most a limit may be), empty, so that everything its members
/// admit comes from the organisations above it, as its own first draw
/// leaves any member bucket. Without it, the members' use of that name
/// would count in no organisation above.
pub fn pass_through(now: Timestamp) -> BucketRow {
    let limits = crate::global_bucket::Limits {
        refill_rate: MAX_REFILL_RATE,
        burst_limit: MAX_REFILL_RATE,
    };
    BucketRow::new(limits, 0.0, true, now)
}

/// A member bucket's standing with its organisation, for operators (the
/// Admin API, `/metrics`, the console): as of its last draw, read at
/// `at`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemberRates {
    /// Tokens per second its last draw asked for.
    pub wanted: f64,
    /// Tokens per second it refills at from its organisation; 0 once its
    /// draw has run out.
    pub drawn: f64,
    /// The part of `wanted` its guarantee covers.
    pub guaranteed: f64,
    /// What it draws beyond its guarantee: its siblings' idle share.
    pub borrowed: f64,
    /// Draws made.
    pub draws: u64,
}

impl MemberRates {
    /// The rates of `row`, the bucket `bucket` of `member` (`None`: a
    /// bucket that belongs to no organisation, all zero).
    pub fn of(
        row: &BucketRow,
        member: Option<&Member>,
        bucket: &BucketName,
        at: Timestamp,
    ) -> Self {
        let Some(draw) = row.draw.as_deref() else {
            return MemberRates::default();
        };
        let drawn = row
            .state
            .drawn
            .filter(|d| d.until > at)
            .map_or(0.0, |d| d.rate);
        let guaranteed = member
            .map_or(0.0, |m| m.guaranteed_rate(bucket))
            .min(draw.wants);
        MemberRates {
            wanted: draw.wants,
            drawn,
            guaranteed,
            borrowed: (drawn - guaranteed).max(0.0),
            draws: draw.draws,
        }
    }
}

/// The rules an organisation's bucket serves its members' draws by: the
/// server's, except that a member silent for two draw periods (a busy
/// member draws about once a period) leaves the shares, so what it no
/// longer wants goes to the others.
pub fn parent_config(config: &GlobalBucketConfig) -> GlobalBucketConfig {
    // (At least a second: a draw period of zero, which draws on every
    // request, must not take every other member for silent.)
    let silent = config
        .draw_period
        .saturating_mul(2)
        .max(Duration::from_secs(1));
    GlobalBucketConfig {
        inactivity_timeout: config.inactivity_timeout.min(silent),
        reported_dead_timeout: config.reported_dead_timeout.min(silent),
        ..config.clone()
    }
}

/// Whether `head`, a bucket of `member`, must draw before serving a
/// request at `now`: it never drew from that organisation, or its period
/// is over.
pub fn draw_due(head: &BucketRow, member: &Member, now: Timestamp) -> bool {
    match &head.draw {
        Some(draw) => !draw.is_from(member) || now >= draw.next,
        None => true,
    }
}

impl Draw {
    /// Whether these are the draws of `member` (not of an earlier
    /// membership of the same bucket).
    pub fn is_from(&self, member: &Member) -> bool {
        self.organisation == member.organisation && self.member_id == member.member_id
    }
}

/// The ask of a member bucket to its organisation's bucket: a token-bucket
/// request as the member's instance, and the guaranteed rate it claims.
/// `pending` is what this transaction's pod requests ask for (not yet in
/// the head's tally).
pub fn ask(
    key: &BucketKey,
    head: &BucketRow,
    member: &Member,
    pending: f64,
    now: Timestamp,
    draw_period: Duration,
) -> (TokenBucketRequest, f64) {
    let period = ask_period(draw_period);
    let same = head.draw.as_ref().filter(|d| d.is_from(member));
    let (asked, since, seq, consumption) = match same {
        Some(d) => (
            d.asked + pending,
            d.asked_since,
            d.seq + 1,
            head.totals.consumption.saturating_sub(&d.reported),
        ),
        // A new member reports nothing from before it joined.
        None => (pending, now, 1, Consumption::default()),
    };
    let secs = now.seconds_since(since).max(period.as_secs_f64());
    let ceiling = head.state.limits.refill_rate;
    let wants = (asked.max(0.0) / secs).min(ceiling);
    let guaranteed = member.guaranteed_rate(&key.bucket).min(wants);
    let request = TokenBucketRequest {
        instance_id: member.member_id,
        lease: key.tenant.as_str().as_bytes().to_vec(),
        seq,
        requested_tokens: wants * period.as_secs_f64(),
        shares: (wants - guaranteed).max(0.0),
        target_request_period: period,
        consumption,
        next_live_instance_id: None,
        returned_tokens: 0.0,
        held_tokens: 0.0,
        fallback_tokens: 0.0,
        fallback_duration: Duration::ZERO,
    };
    (request, guaranteed)
}

/// Applies the organisation's answer to the member's bucket: `grant`, or
/// `None` if the organisation has no bucket of this name (the member runs
/// on its own limits until its next draw). The bucket is first brought up
/// to `now` under what it drew before.
pub fn settle(
    head: &mut BucketRow,
    member: &Member,
    ask: &TokenBucketRequest,
    grant: Option<&Grant>,
    now: Timestamp,
    period: Duration,
) {
    let first = !head.draw.as_ref().is_some_and(|d| d.is_from(member));
    if first {
        // From its first draw on, everything the bucket hands out comes
        // from the organisation: tokens it held on its own stay out (its
        // debt stays in), and it refills only by what it draws.
        head.state.refill(now, period);
        head.state.tokens = head.state.tokens.min(0.0);
        head.state.tokens_avg = head.state.tokens_avg.min(0.0);
    } else {
        head.state.refill(now, period);
    }
    // What the last draw has yet to deliver comes with the new one.
    let undelivered = head
        .state
        .drawn
        .map_or(0.0, |d| d.rate * d.until.seconds_since(now));
    let (rate, granted) = match grant {
        None => {
            head.state.drawn = None;
            (0.0, 0.0)
        }
        Some(g) if g.trickle_duration.is_zero() => {
            head.state.tokens += g.granted_tokens + undelivered;
            head.state.drawn = Some(Drawn {
                rate: 0.0,
                until: now,
            });
            (0.0, g.granted_tokens)
        }
        Some(g) => {
            // Delivered over the trickle, or longer if the member's own
            // rate cannot take it in that fast (a short trickle of what
            // the organisation held): nothing drawn is lost to the ceiling.
            let own = head.state.limits.refill_rate;
            let tokens = g.granted_tokens + undelivered;
            let mut secs = g.trickle_duration.as_secs_f64();
            if own > 0.0 {
                secs = secs.max(tokens / own);
            }
            let rate = tokens / secs;
            head.state.drawn = Some(Drawn {
                rate,
                until: now.saturating_add(Duration::from_secs_f64(secs)),
            });
            (rate, g.granted_tokens)
        }
    };
    let draws = head.draw.as_ref().map_or(0, |d| d.draws);
    head.draw = Some(Box::new(Draw {
        organisation: member.organisation.clone(),
        member_id: member.member_id,
        seq: ask.seq,
        next: now.saturating_add(period),
        asked: 0.0,
        asked_since: now,
        reported: head.totals.consumption,
        draws: draws + 1,
        last_rate: rate,
        last_granted: granted,
        wants: ask.requested_tokens / ask.target_request_period.as_secs_f64(),
    }));
}

/// Counts what a pod request asked of a member bucket, for its next draw.
pub fn tally(head: &mut BucketRow, requested: f64) {
    if let Some(draw) = head.draw.as_mut() {
        draw.asked += requested.max(0.0);
    }
}

/// A bucket whose tenant no longer belongs to an organisation: it runs on
/// its own limits from `now` (brought up to `now` under what it drew).
/// True if it had drawn (the row changed).
pub fn release(head: &mut BucketRow, now: Timestamp, period: Duration) -> bool {
    if head.draw.is_none() && head.state.drawn.is_none() {
        return false;
    }
    head.state.refill(now, period);
    head.state.drawn = None;
    head.draw = None;
    true
}

/// What one child asks of its parent for a period.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildAsk {
    /// The refill rate the child wants, tokens per second (what its pods
    /// asked for, over the period).
    pub wants: f64,
    /// The rate reserved for it while it wants it.
    pub guaranteed: f64,
    /// The most it may have: its own bucket's refill rate.
    pub ceiling: f64,
    /// Its weight when what is left is lent out.
    pub shares: f64,
}

impl ChildAsk {
    /// The most this child can take: what it wants, at most its ceiling.
    fn cap(&self) -> f64 {
        clean(self.wants).min(clean(self.ceiling))
    }
}

/// A non-negative finite number, or 0.
fn clean(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 { x } else { 0.0 }
}

/// Relative slack of the water-filling's sums.
const ROUNDING: f64 = 1e-12;

/// The rate each child gets of the parent's `rate`, in the children's
/// order: guarantees first (cut in proportion if they exceed the rate),
/// then what is left by shares among the children that want more, each up
/// to the least of what it wants and its ceiling.
pub fn allocate(rate: f64, children: &[ChildAsk]) -> Vec<f64> {
    let rate = clean(rate);
    let caps: Vec<f64> = children.iter().map(ChildAsk::cap).collect();
    // 1. Guarantees, each at most the child's cap.
    let floors: Vec<f64> = children
        .iter()
        .zip(&caps)
        .map(|(c, &cap)| clean(c.guaranteed).min(cap))
        .collect();
    let floor_sum: f64 = floors.iter().sum();
    if floor_sum >= rate {
        let scale = if floor_sum > 0.0 {
            rate / floor_sum
        } else {
            0.0
        };
        return floors.iter().map(|f| f * scale).collect();
    }
    let mut given = floors;
    let mut left = rate - floor_sum;
    // 2. Water-filling by shares over the children still below their cap.
    // Each round either hands out all that is left or fills at least one
    // child to its cap, so it ends within as many rounds as children.
    loop {
        let open: Vec<usize> = (0..children.len())
            .filter(|&i| caps[i] - given[i] > caps[i] * ROUNDING)
            .collect();
        if open.is_empty() || left <= rate * ROUNDING {
            break;
        }
        let weights: Vec<f64> = open
            .iter()
            .map(|&i| {
                let s = clean(children[i].shares);
                // A child with no shares still borrows, last and least:
                // the smallest positive weight keeps it from starving
                // while capacity sits idle.
                if s > 0.0 { s } else { f64::MIN_POSITIVE }
            })
            .collect();
        let total: f64 = weights.iter().sum();
        // The largest fill level (rate per share) no open child passes.
        let level = open
            .iter()
            .zip(&weights)
            .map(|(&i, w)| (caps[i] - given[i]) / w)
            .fold(left / total, f64::min);
        let mut handed = 0.0;
        for (&i, w) in open.iter().zip(&weights) {
            let more = (level * w).min(caps[i] - given[i]);
            given[i] += more;
            handed += more;
        }
        left -= handed;
        if handed <= 0.0 {
            break;
        }
    }
    given
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ask(wants: f64, guaranteed: f64, ceiling: f64, shares: f64) -> ChildAsk {
        ChildAsk {
            wants,
            guaranteed,
            ceiling,
            shares,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn a_members_rates_cover_its_guarantee_while_it_wants_it_and_its_draw_while_it_runs() {
        let at = Timestamp::from_secs_f64(100.0);
        let bucket = BucketName::REQUEST_UNITS;
        let org = TenantId::parse("org", "acme").expect("id");
        let limits = crate::global_bucket::Limits {
            refill_rate: 50.0,
            burst_limit: 100.0,
        };
        let mut row = BucketRow::new(limits, 0.0, true, at);
        let member = Member {
            organisation: org.clone(),
            member_id: 1,
            guaranteed: [(bucket.clone(), 10.0)].into(),
            since: at,
        };
        assert_eq!(
            MemberRates::of(&row, Some(&member), &bucket, at),
            MemberRates::default(),
            "no draw yet"
        );
        row.draw = Some(Box::new(Draw {
            organisation: org,
            member_id: 1,
            seq: 4,
            next: at,
            asked: 0.0,
            asked_since: at,
            reported: Consumption::default(),
            draws: 4,
            last_rate: 30.0,
            last_granted: 0.0,
            wants: 40.0,
        }));
        row.state.drawn = Some(Drawn {
            rate: 30.0,
            until: Timestamp::from_secs_f64(105.0),
        });
        let rates = MemberRates::of(&row, Some(&member), &bucket, at);
        assert_eq!(
            rates,
            MemberRates {
                wanted: 40.0,
                drawn: 30.0,
                guaranteed: 10.0,
                borrowed: 20.0,
                draws: 4,
            }
        );
        // Wanting less than its guarantee: only what it wants is covered.
        if let Some(draw) = row.draw.as_mut() {
            draw.wants = 6.0;
        }
        assert_eq!(
            MemberRates::of(&row, Some(&member), &bucket, at).guaranteed,
            6.0
        );
        // Its draw run out: nothing drawn, nothing borrowed.
        let later = Timestamp::from_secs_f64(105.0);
        let rates = MemberRates::of(&row, Some(&member), &bucket, later);
        assert_eq!((rates.drawn, rates.borrowed), (0.0, 0.0));
    }

    #[test]
    fn two_busy_children_split_by_shares_and_an_idle_one_lends_everything() {
        let busy = |shares| ask(1_000.0, 0.0, 1_000.0, shares);
        let got = allocate(100.0, &[busy(1.0), busy(3.0)]);
        assert!(close(got[0], 25.0) && close(got[1], 75.0), "{got:?}");
        // The first goes idle: the second gets the whole rate.
        let got = allocate(100.0, &[ask(0.0, 0.0, 1_000.0, 1.0), busy(3.0)]);
        assert!(close(got[0], 0.0) && close(got[1], 100.0), "{got:?}");
    }

    #[test]
    fn a_guarantee_is_met_first_and_a_ceiling_is_never_passed() {
        // A guarantees 60 but wants 40; B is capped at 30; C takes the rest.
        let got = allocate(
            100.0,
            &[
                ask(40.0, 60.0, 1_000.0, 1.0),
                ask(500.0, 0.0, 30.0, 10.0),
                ask(500.0, 0.0, 1_000.0, 1.0),
            ],
        );
        assert!(close(got[0], 40.0), "{got:?}");
        assert!(close(got[1], 30.0), "{got:?}");
        assert!(close(got[2], 30.0), "{got:?}");
        // Guarantees wanted beyond the rate are cut in proportion.
        let got = allocate(
            90.0,
            &[ask(100.0, 60.0, 100.0, 1.0), ask(200.0, 120.0, 200.0, 1.0)],
        );
        assert!(close(got[0], 30.0) && close(got[1], 60.0), "{got:?}");
    }

    fn children() -> impl Strategy<Value = Vec<ChildAsk>> {
        proptest::collection::vec(
            (0.0f64..500.0, 0.0f64..100.0, 0.0f64..400.0, 0.0f64..5.0)
                .prop_map(|(w, g, c, s)| ask(w, g, c, s)),
            1..12,
        )
    }

    proptest! {
        /// Whatever the asks: the children together get at most the rate;
        /// each at most its cap (wants, ceiling); each at least its wanted
        /// guarantee when the guarantees fit; and no capacity is left idle
        /// while a child below its cap wants more (work conserving).
        #[test]
        fn allocations_keep_the_rules(rate in 0.0f64..1_000.0, children in children()) {
            let got = allocate(rate, &children);
            prop_assert_eq!(got.len(), children.len());
            let sum: f64 = got.iter().sum();
            prop_assert!(sum <= rate * (1.0 + 1e-9) + 1e-9, "{sum} > {rate}");
            let caps: Vec<f64> = children.iter().map(ChildAsk::cap).collect();
            for (g, cap) in got.iter().zip(&caps) {
                prop_assert!(*g >= 0.0 && *g <= cap * (1.0 + 1e-9) + 1e-12, "{g} beyond {cap}");
            }
            let floors: Vec<f64> = children.iter().zip(&caps).map(|(c, cap)| c.guaranteed.min(*cap)).collect();
            if floors.iter().sum::<f64>() <= rate {
                for (g, f) in got.iter().zip(&floors) {
                    prop_assert!(*g >= f * (1.0 - 1e-9) - 1e-12, "{g} under its guarantee {f}");
                }
            }
            let cap_sum: f64 = caps.iter().sum();
            prop_assert!(
                close(sum, rate.min(cap_sum)) || sum >= rate.min(cap_sum) * (1.0 - 1e-9),
                "idle capacity: gave {sum} of {rate}, caps {cap_sum}"
            );
        }

        /// Among children that are not at their cap and have equal shares
        /// and no guarantee, the split is equal (max-min fair).
        #[test]
        fn equal_children_get_equal_rates(rate in 1.0f64..1_000.0, n in 2usize..10) {
            let children = vec![ask(1e6, 0.0, 1e6, 1.0); n];
            let got = allocate(rate, &children);
            for g in &got {
                prop_assert!(close(*g, rate / n as f64), "{got:?}");
            }
        }
    }
}
