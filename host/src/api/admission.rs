//! Admission: how much of the control plane each caller may hold at once.
//!
//! Every authenticated request takes a turn from its caller's share (a
//! tenant's policy says how many requests, and how many bytes of module
//! uploads, it may have in flight; the admin has a share of its own) and
//! gives it back when its answer is ready. A request past its caller's
//! share is refused at once with 429 and `Retry-After`, never queued: a
//! tenant holding its share with slow uploads slows no one but itself,
//! and what other tenants, the admin and the unauthenticated routes
//! (`/healthz`, the dashboard's pages) get does not depend on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::service::Caller;

/// What one caller may have in flight at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    /// Requests.
    pub(crate) requests: u32,
    /// Bytes of module uploads (each counts its declared size, or the
    /// host's largest module when it declares none).
    pub(crate) upload_bytes: u64,
}

/// The admin's share: its calls are few, but must not wait on a tenant's.
pub(crate) const ADMIN_SHARE: Share = Share { requests: 32, upload_bytes: 0 };

/// What every caller holds now.
#[derive(Debug, Default, Clone)]
pub(crate) struct Admission {
    held: Arc<Mutex<HashMap<Holder, Held>>>,
}

/// Whose share a turn comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Holder {
    Admin,
    Tenant(String),
}

#[derive(Debug, Default)]
struct Held {
    requests: u32,
    upload_bytes: u64,
}

/// Why a turn was refused: the message names the share.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// As many requests in flight as the share allows.
    #[error(
        "you have {limit} requests in flight, as many as your policy's `max-requests` allows at once: try again \
         when one has been answered"
    )]
    Requests {
        /// The share's requests.
        limit: u32,
    },
    /// Uploads in flight would pass the share's bytes.
    #[error(
        "this upload's {size} bytes and the {held} bytes of your uploads in flight would be over your policy's \
         `max-upload-bytes` of {limit}: try again when one has finished"
    )]
    UploadBytes {
        /// This upload's size.
        size: u64,
        /// What the caller's other uploads hold.
        held: u64,
        /// The share's bytes.
        limit: u64,
    },
}

/// A turn taken from a caller's share; given back when dropped.
#[derive(Debug)]
pub(crate) struct Turn {
    admission: Admission,
    holder: Holder,
    upload_bytes: u64,
    request: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut held = lock(&self.admission.held);
        if let Some(entry) = held.get_mut(&self.holder) {
            entry.requests -= u32::from(self.request);
            entry.upload_bytes -= self.upload_bytes;
            if entry.requests == 0 && entry.upload_bytes == 0 {
                held.remove(&self.holder);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Admission {
    /// Takes a request's turn from `caller`'s `share`, or refuses it.
    pub(crate) fn request(&self, caller: &Caller, share: Share) -> Result<Turn, Refused> {
        let holder = holder(caller);
        let mut held = lock(&self.held);
        let entry = held.entry(holder.clone()).or_default();
        if entry.requests >= share.requests {
            return Err(Refused::Requests { limit: share.requests });
        }
        entry.requests += 1;
        Ok(Turn { admission: self.clone(), holder, upload_bytes: 0, request: true })
    }

    /// Takes `size` bytes of uploads in flight from `caller`'s `share`, or
    /// refuses them.
    pub(crate) fn upload(&self, caller: &Caller, share: Share, size: u64) -> Result<Turn, Refused> {
        let holder = holder(caller);
        let mut held = lock(&self.held);
        let entry = held.entry(holder.clone()).or_default();
        if entry.upload_bytes.saturating_add(size) > share.upload_bytes {
            let refused = Refused::UploadBytes { size, held: entry.upload_bytes, limit: share.upload_bytes };
            if entry.requests == 0 && entry.upload_bytes == 0 {
                held.remove(&holder);
            }
            return Err(refused);
        }
        entry.upload_bytes += size;
        Ok(Turn { admission: self.clone(), holder, upload_bytes: size, request: false })
    }

    /// Requests in flight per tenant, for metrics.
    #[cfg(test)]
    fn requests_of(&self, caller: &Caller) -> u32 {
        lock(&self.held).get(&holder(caller)).map_or(0, |h| h.requests)
    }
}

fn holder(caller: &Caller) -> Holder {
    match caller {
        Caller::Admin => Holder::Admin,
        Caller::Tenant(name) => Holder::Tenant(name.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_turns_are_bounded_by_its_share_and_given_back() {
        let admission = Admission::default();
        let (a, b) = (Caller::Tenant("a".into()), Caller::Tenant("b".into()));
        let share = Share { requests: 2, upload_bytes: 100 };
        let first = admission.request(&a, share).expect("first");
        let second = admission.request(&a, share).expect("second");
        assert_eq!(admission.request(&a, share).err(), Some(Refused::Requests { limit: 2 }));
        // Another tenant's share, and the admin's, are their own.
        let other = admission.request(&b, share).expect("another tenant");
        let admin = admission.request(&Caller::Admin, ADMIN_SHARE).expect("the admin");
        drop(first);
        let third = admission.request(&a, share).expect("a turn given back is taken again");
        drop((second, third, other, admin));
        assert_eq!(admission.requests_of(&a), 0);
        assert!(lock(&admission.held).is_empty(), "nothing is kept for callers holding nothing");

        let upload = admission.upload(&a, share, 60).expect("60 of 100 bytes");
        assert_eq!(
            admission.upload(&a, share, 50).err(),
            Some(Refused::UploadBytes { size: 50, held: 60, limit: 100 })
        );
        let small = admission.upload(&a, share, 40).expect("40 more fit");
        drop((upload, small));
        assert!(lock(&admission.held).is_empty());
        assert!(admission.upload(&a, share, u64::MAX).is_err(), "no overflow");
    }
}
