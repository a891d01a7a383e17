//! Whether the rest of a job is quiet, for a member of the job's group that
//! holds only some of its shards.
//!
//! Such a member may sleep only while the whole job is idle: leaving the
//! group hands its shards to the other members, so it must not leave while
//! they work, and once asleep a record anywhere in the job wakes it (see
//! `TaskRunner::may_sleep`). Kafka says whether the others work: the
//! group's committed offsets of the partitions they hold move with every
//! checkpoint that read something. An idle member reads them now and then
//! ([`OthersQuiet::LOOK_EVERY`]); the rest of the job is quiet once they
//! stayed the same for the job's `input.sleep-after`. A partition without a
//! committed offset is one no member has taken up yet: never quiet.

use std::time::{Duration, Instant};

use crate::checkpoint::PartitionOffset;

/// A partition of the other members' and the group's committed offset
/// there, if any.
pub(super) type Committed = ((String, i32), Option<i64>);

/// The other members' committed offsets, as one member saw them.
#[derive(Debug, Default)]
pub(super) struct OthersQuiet {
    /// The offsets last read (by partition, none where the group has no
    /// offset), and since when they read so.
    seen: Option<(Vec<Committed>, Instant)>,
    /// When to read them again.
    next_look: Option<Instant>,
}

impl OthersQuiet {
    /// How often an idle member reads the others' committed offsets: one
    /// request to the group's coordinator.
    pub(super) const LOOK_EVERY: Duration = Duration::from_secs(1);
    /// How long a look may wait on the coordinator: the task thread waits
    /// with it, and a stop with the task.
    pub(super) const LOOK_TIMEOUT: Duration = Duration::from_secs(5);

    /// Whether the offsets are to be read again at `now`; if so, the next
    /// look is [`LOOK_EVERY`](Self::LOOK_EVERY) later.
    pub(super) fn due(&mut self, now: Instant) -> bool {
        if self.next_look.is_some_and(|next| now < next) {
            return false;
        }
        self.next_look = Some(now + Self::LOOK_EVERY);
        true
    }

    /// Notes `offsets`, read at `now`. Once they have read the same for
    /// `quiet`, the positions to watch the other members' partitions from;
    /// none before, or while a partition has no offset.
    pub(super) fn note(
        &mut self,
        offsets: Vec<Committed>,
        now: Instant,
        quiet: Duration,
    ) -> Option<Vec<PartitionOffset>> {
        let since = match self.seen.take() {
            Some((seen, since)) if seen == offsets => since,
            _ => now,
        };
        let positions = offsets
            .iter()
            .map(|((topic, partition), offset)| {
                offset.map(|next_offset| PartitionOffset { topic: topic.clone(), partition: *partition, next_offset })
            })
            .collect::<Option<Vec<_>>>();
        self.seen = Some((offsets, since));
        positions.filter(|_| now.duration_since(since) >= quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(partition: i32, offset: Option<i64>) -> Committed {
        (("in".to_owned(), partition), offset)
    }

    #[test]
    fn the_others_are_quiet_once_their_offsets_stayed_the_same_for_the_whole_span() {
        let quiet = Duration::from_secs(3);
        let t0 = Instant::now();
        let mut others = OthersQuiet::default();
        assert!(others.note(vec![at(1, Some(10))], t0, quiet).is_none(), "just seen");
        assert!(others.note(vec![at(1, Some(10))], t0 + Duration::from_secs(2), quiet).is_none());
        // A checkpoint that read something moves them: the span starts anew.
        assert!(others.note(vec![at(1, Some(12))], t0 + Duration::from_secs(3), quiet).is_none());
        assert!(others.note(vec![at(1, Some(12))], t0 + Duration::from_secs(5), quiet).is_none());
        let positions = others.note(vec![at(1, Some(12))], t0 + Duration::from_secs(6), quiet).expect("quiet for 3 s");
        assert_eq!(positions, [PartitionOffset { topic: "in".into(), partition: 1, next_offset: 12 }]);
    }

    #[test]
    fn a_partition_no_member_committed_is_never_quiet() {
        let t0 = Instant::now();
        let mut others = OthersQuiet::default();
        for s in 0..5 {
            let offsets = vec![at(1, Some(10)), at(2, None)];
            assert!(others.note(offsets, t0 + Duration::from_secs(s), Duration::from_secs(1)).is_none());
        }
    }

    #[test]
    fn an_idle_member_looks_at_most_once_a_second() {
        let t0 = Instant::now();
        let mut others = OthersQuiet::default();
        assert!(others.due(t0));
        assert!(!others.due(t0 + Duration::from_millis(999)));
        assert!(others.due(t0 + OthersQuiet::LOOK_EVERY));
    }
}
