//! Instance leases: how the server tells one incarnation of a pod from the
//! next.
//!
//! The server orders the leases of an instance id as byte strings and
//! refuses requests from a lease lower than the one it last heard from, so
//! a late copy of a request sent before a restart never counts again. A
//! lease is therefore 8 bytes of the process's start time (nanoseconds
//! since the Unix epoch, big-endian, so byte order is time order) followed
//! by 8 random bytes (so two pods started in the same nanosecond differ).
//! Each bucket of a controller takes a lease of its own.

use std::time::SystemTime;

/// The length of the leases this client makes.
pub const LEASE_LEN: usize = 16;

/// A lease for a new incarnation: greater than `previous` (the lease of the
/// incarnation it follows in this process, if any), and greater than any
/// lease made earlier on this host as long as its clock does not step back.
pub fn new_lease(previous: Option<&[u8]>) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let after_previous = previous
        .and_then(|p| p.get(..8))
        .and_then(|p| <[u8; 8]>::try_from(p).ok())
        .map_or(0, |p| u64::from_be_bytes(p).saturating_add(1));
    let mut lease = Vec::with_capacity(LEASE_LEN);
    lease.extend_from_slice(&now.max(after_previous).to_be_bytes());
    lease.extend_from_slice(&rand::random::<[u8; 8]>());
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_new_lease_is_greater_than_the_one_before() {
        let mut previous = new_lease(None);
        assert_eq!(previous.len(), LEASE_LEN);
        for _ in 0..1000 {
            let next = new_lease(Some(&previous));
            assert!(next > previous);
            previous = next;
        }
        // Even after a lease from the future (a clock that stepped back).
        let future = [0xff; LEASE_LEN];
        let mut ahead = future.to_vec();
        ahead[7] = 0xfe;
        assert!(new_lease(Some(&ahead)) > ahead);
    }
}
