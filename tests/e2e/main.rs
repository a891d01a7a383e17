//! End-to-end tests on a real Apache Kafka broker: `sluice run` as a child
//! process, killed and restarted, with its committed output checked by a
//! read_committed consumer.
//!
//! The broker: `SLUICE_TEST_BROKERS` if set (scripts/test.sh starts one with
//! scripts/kafka.sh and sets it), else these tests start one themselves with
//! scripts/kafka.sh on port 19092. No broker means failing tests, not
//! skipped ones.
//!
//! - `api_fuzz`: a schema-driven fuzzer (schemathesis) finds the API doing
//!   exactly what its OpenAPI document says.
//! - `cli`: the CLI verbs drive a job on a host, from a TOML job file.
//! - `cluster`: three `sluice serve --cluster` hosts share their metadata
//!   through Kafka: written on one, served by all, conflicts decided once,
//!   a restarted host caught up before it serves, a wrong admin token or
//!   another cluster's name kept out.
//! - `control_plane`: a tenant holding slow uploads past its share slows no
//!   other caller (429 for its excess); silent, idle and surplus connections
//!   are closed.
//! - `dashboard`: the web dashboard in headless Chromium: sign-in, a job's
//!   figures rising, a failed job's reason and record, stop and resume, and
//!   another tenant kept out even by URL.
//! - `examples`: the examples give exactly the expected output.
//! - `failpoints`: crash at each step of the protocol, restart, verify.
//! - `crash_loop`: kill -9 at random moments while input streams in, verify.
//! - `dead_letter`: records that always fail, under both error policies,
//!   exactly once across a crash.
//! - `broker_restart`: stop the broker mid-job and start it again, verify.
//! - `guest_trap`: a guest that traps on one record, once, verify.
//! - `hardening`: lost state refused (without a changelog), `latest` start committed first, idle
//!   offsets kept alive past the broker's retention, binary header keys.
//! - `identity`: a reset clearing the state through one cluster member, and a
//!   job deleted and created again while a member was down: no member runs
//!   on the state of the job's previous incarnation.
//! - `module_bytes`: a deleted module, and an upload refused (409, 403, 413,
//!   503) or cut short by a crash, leave nothing on any cluster member or in
//!   the modules topic.
//! - `rescale`: 2 -> 3 -> 1 -> 4 tasks through kill -9 and crashes inside a
//!   rescale; a shard moving back and forth keeps its checkpoint ids growing.
//! - `changelog`: a deleted state directory comes back from the changelog,
//!   exactly once; turning the changelog on later writes the state first.
//! - `time`: tumbling windows' counts exactly once through kill -9, rescales
//!   and a lost state directory (timers and watermarks move with their
//!   shard); a late record does not reopen a closed window.
//! - `slow_log`: a member whose write to the cluster's log hangs still answers
//!   other tenants' calls and places jobs meanwhile.
//! - `sleeping`: idle tasks on the shared host let go of their Kafka
//!   clients, wake for input or their heartbeat, and stop at once; output
//!   stays exactly once, for two jobs over one topic too.
//! - `shards`: co-partitioned input topics meet in one shard's state; input
//!   topics that are not co-partitioned are refused.
//! - `serve`: the shared host (`sluice serve`) over HTTP: tokens, tenants,
//!   uploads, a job's life through stop, resume and host crashes; scaling a
//!   running job; a lost state directory restored, as its status shows.
//! - `isolation`: a hostile job (loops, allocates, emits, grows state, traps)
//!   beside a good one on one host; the good one's output stays exact.
//! - `languages`: running-count in all five guest languages, identical output.
//! - `lingering`: the host aborts a transaction a hung task left open.
//! - `memory`: a tenant driving its jobs at its policy's limits keeps the
//!   host's resident memory within what docs/memory.md says it can cost.
//! - `tls`: the API over TLS, for curl and the CLI; a renewed certificate
//!   served without a restart, a broken renewal keeping the last good one.
//! - `upgrade`: a job upgraded to a module with a `migrate` hook keeps its
//!   state in the new layout and its counts continue exactly.
//!
//! "Verify" for running-count means: for every key, the committed outputs
//! are exactly 1, 2, ..., n in order, where n is the number of inputs with
//! that key: nothing lost, nothing doubled, state in step with output.

#![allow(unreachable_pub, missing_docs)]

#[path = "../../host/tests/support/mod.rs"]
mod guests;
mod host;
mod support;

mod api_fuzz;
mod broker_restart;
mod changelog;
mod cli;
mod cluster;
mod control_plane;
mod crash_loop;
mod dashboard;
mod dead_letter;
mod examples;
mod failpoints;
mod guest_trap;
mod hardening;
mod identity;
mod isolation;
mod languages;
mod lingering;
mod memory;
mod module_bytes;
mod rescale;
mod serve;
mod shards;
mod sleeping;
mod slow_log;
mod time;
mod tls;
mod upgrade;
