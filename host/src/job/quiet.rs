//! Whether the rest of a job is quiet, for a member of the job's group that
//! holds only some of its shards.
//!
//! Such a member may sleep only while the whole job is idle: leaving the
//! group hands its shards to the other members, so it must not leave while
//! they work, and once asleep a record anywhere in the job wakes it (see
//! `TaskRunner::may_sleep`). Kafka says whether the others work: the
//! group's committed offsets of the partitions they hold move with every
//! checkpoint that read something. An idle member reads them now and then
//! (a quarter of the job's `input.sleep-after`, at least a second apart);
//! the rest of the job is quiet once they stayed the same for the whole
//! `sleep-after`, and nothing waits to be read past them ([`read_to`]: a
//! member stuck on its input commits nothing either). A partition without
//! a committed offset is one no member has taken up yet: never quiet.

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

/// How long a look may wait on Kafka: the task thread waits with it, and
/// a stop with the task.
pub(super) const LOOK_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a partition whose committed offset is `next` has nothing left to
/// read before `end` (its high watermark). One offset may be a transaction's
/// commit marker, which no reader sees: if it was a record instead, the
/// member that sleeps wakes for it at once, which costs a rebalance, not a
/// record.
pub(super) fn read_to(next: i64, end: i64) -> bool {
    end - next <= 1
}

impl OthersQuiet {
    /// Whether the offsets are to be read again at `now`, for a job that
    /// sleeps after `after`; if so, the next look is a quarter of that
    /// later, at least a second: one request to the group's coordinator.
    pub(super) fn due(&mut self, now: Instant, after: Duration) -> bool {
        if self.next_look.is_some_and(|next| now < next) {
            return false;
        }
        self.next_look = Some(now + (after / 4).max(Duration::from_secs(1)));
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
    fn an_idle_member_looks_four_times_per_sleep_after_and_at_most_once_a_second() {
        let t0 = Instant::now();
        let mut others = OthersQuiet::default();
        let after = Duration::from_secs(30);
        assert!(others.due(t0, after));
        assert!(!others.due(t0 + Duration::from_millis(7_499), after));
        assert!(others.due(t0 + Duration::from_millis(7_500), after));
        let mut others = OthersQuiet::default();
        assert!(others.due(t0, Duration::from_secs(2)));
        assert!(!others.due(t0 + Duration::from_millis(999), Duration::from_secs(2)));
        assert!(others.due(t0 + Duration::from_secs(1), Duration::from_secs(2)));
    }

    #[test]
    fn a_partition_is_read_to_its_end_but_for_a_commit_marker() {
        assert!(read_to(10, 10));
        assert!(read_to(10, 11), "a commit marker, or one record the sleeper wakes for");
        assert!(!read_to(10, 12));
        assert!(!read_to(10, 500), "a member stuck on a backlog commits nothing either");
    }
}
