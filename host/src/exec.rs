//! `sluice exec`: run a transform locally over JSON-lines records.
//!
//! This is the transform author's inner loop: no Kafka, no checkpoints, the
//! same runtime, sandbox, batch ABI and state semantics as a real job. State
//! lives for the length of the run.
//!
//! Input, one JSON object per line (every field optional):
//!
//! ```text
//! {"key": "user-1", "value": "hello", "headers": {"h": "v"}, "timestamp": 1700000000000,
//!  "topic": "events", "partition": 0, "offset": 41}
//! ```
//!
//! `key` and `value` may be strings (their UTF-8 bytes), any other JSON value
//! (its compact text), or `null`; `key_base64`/`value_base64` give raw bytes.
//! `topic` defaults to `input`, `partition` to 0, `offset` to the record's
//! index in the input. Output, one line per output record, in order:
//!
//! ```text
//! {"key":"user-1","value":"HELLO"}
//! ```
//!
//! with `topic` and `headers` when the transform set them, and `key_base64` /
//! `value_base64` for bytes that are not UTF-8.
//!
//! Time, for transforms that use timers (world `timed`): the records'
//! `timestamp`s move each partition's watermark as in a job
//! (`--max-out-of-orderness`), and two kinds of line make time pass:
//!
//! ```text
//! {"watermark": 1700000060000}        # every partition's watermark is at least this now
//! {"processing_time": 1700000060000}  # the host's clock reads this now (it starts at 0)
//! ```
//!
//! After each batch and each such line, due timers fire (`on-timers`) and
//! their outputs follow, so a window's result appears where its watermark
//! passes. Nothing fires at the end of the input by itself: end a test with
//! a `watermark` line past its last window.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use crate::record::{Header, InputRecord, OutputRecord};
use crate::runtime::{self, Instance};

/// An error from `sluice exec`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A line of input is not a valid record.
    #[error("input line {line}: {message}")]
    Input {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// Reading input or writing output failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The transform failed.
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
}

/// What a run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Records read.
    pub records_in: u64,
    /// Records written.
    pub records_out: u64,
    /// Batches passed to the guest.
    pub batches: u64,
    /// Timers fired.
    pub timers_fired: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonInput {
    #[serde(default)]
    key: Option<serde_json::Value>,
    key_base64: Option<String>,
    #[serde(default)]
    value: Option<serde_json::Value>,
    value_base64: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    timestamp: Option<i64>,
    topic: Option<String>,
    partition: Option<i32>,
    offset: Option<i64>,
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_base64: Option<String>,
    value: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    topic: Option<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<&'a str, String>,
}

fn json_bytes(
    value: Option<serde_json::Value>,
    base64: Option<String>,
    field: &str,
) -> Result<Option<Vec<u8>>, String> {
    match (value, base64) {
        (Some(_), Some(_)) => Err(format!("give either `{field}` or `{field}_base64`, not both")),
        (None, Some(b64)) => BASE64.decode(b64.as_bytes()).map(Some).map_err(|e| format!("`{field}_base64`: {e}")),
        (None | Some(serde_json::Value::Null), None) => Ok(None),
        (Some(serde_json::Value::String(s)), None) => Ok(Some(s.into_bytes())),
        (Some(other), None) => Ok(Some(other.to_string().into_bytes())),
    }
}

/// A line that makes time pass.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonTime {
    watermark: Option<i64>,
    processing_time: Option<i64>,
}

/// One line of input.
enum Line {
    Record(Box<InputRecord>),
    Time(JsonTime),
}

fn parse_line(line: &str, index: usize) -> Result<Line, String> {
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).map_err(|e| e.to_string())?;
    if object.contains_key("watermark") || object.contains_key("processing_time") {
        let time = serde_json::from_value(serde_json::Value::Object(object))
            .map_err(|e| format!("{e} (a line with `watermark` or `processing_time` is about time, not a record)"))?;
        return Ok(Line::Time(time));
    }
    record_from(serde_json::from_value(serde_json::Value::Object(object)).map_err(|e| e.to_string())?, index)
        .map(|record| Line::Record(Box::new(record)))
}

/// Parses one input line (`index` is its 0-based position among records).
pub fn parse_record(line: &str, index: usize) -> Result<InputRecord, String> {
    record_from(serde_json::from_str(line).map_err(|e| e.to_string())?, index)
}

fn record_from(input: JsonInput, index: usize) -> Result<InputRecord, String> {
    Ok(InputRecord {
        key: json_bytes(input.key, input.key_base64, "key")?,
        value: json_bytes(input.value, input.value_base64, "value")?,
        headers: input.headers.into_iter().map(|(key, value)| Header { key, value: value.into_bytes() }).collect(),
        timestamp: input.timestamp,
        topic: input.topic.unwrap_or_else(|| "input".to_string()),
        partition: input.partition.unwrap_or(0),
        offset: input.offset.unwrap_or(i64::try_from(index).unwrap_or(i64::MAX)),
    })
}

/// Renders one output record as a JSON line (without the newline).
pub fn render_output(record: &OutputRecord) -> String {
    fn split(bytes: &Option<Vec<u8>>) -> (Option<&str>, Option<String>) {
        match bytes.as_deref() {
            None => (None, None),
            Some(b) => match std::str::from_utf8(b) {
                Ok(s) => (Some(s), None),
                Err(_) => (None, Some(BASE64.encode(b))),
            },
        }
    }
    let (key, key_base64) = split(&record.key);
    let (value, value_base64) = split(&record.value);
    let out = JsonOutput {
        key,
        key_base64,
        value,
        value_base64,
        topic: record.topic.as_deref(),
        headers: record
            .headers
            .iter()
            .map(|h| (h.key.as_str(), String::from_utf8_lossy(&h.value).into_owned()))
            .collect(),
    };
    // Serializing a struct of strings and maps of strings cannot fail.
    serde_json::to_string(&out).unwrap_or_default()
}

/// Feeds `input` through `instance` in batches of `batch_size` and writes the
/// outputs to `output`, flushing after each batch. Lines that make time pass
/// end the batch before them; due timers fire after each batch and each such
/// line. The instance's processing time is virtual and starts at 0.
pub fn run(
    instance: &mut Instance,
    input: impl BufRead,
    mut output: impl Write,
    batch_size: usize,
) -> Result<Stats, Error> {
    let batch_size = batch_size.max(1);
    let mut stats = Stats::default();
    let mut batch = Vec::with_capacity(batch_size);
    let mut index = 0usize;
    let mut clock_ms = 0i64;
    instance.set_virtual_clock(clock_ms);
    for (line_no, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(&line, index).map_err(|message| Error::Input { line: line_no + 1, message })? {
            Line::Record(record) => {
                index += 1;
                batch.push(*record);
                if batch.len() == batch_size {
                    flush_batch(instance, &mut batch, &mut output, &mut stats)?;
                }
            }
            Line::Time(time) => {
                if !batch.is_empty() {
                    flush_batch(instance, &mut batch, &mut output, &mut stats)?;
                }
                if let Some(at) = time.processing_time {
                    clock_ms = clock_ms.max(at);
                    instance.set_virtual_clock(clock_ms);
                }
                if let Some(at) = time.watermark {
                    instance.force_watermark(at);
                }
                fire(instance, &mut output, &mut stats)?;
            }
        }
    }
    if !batch.is_empty() {
        flush_batch(instance, &mut batch, &mut output, &mut stats)?;
    }
    Ok(stats)
}

fn flush_batch(
    instance: &mut Instance,
    batch: &mut Vec<InputRecord>,
    output: &mut impl Write,
    stats: &mut Stats,
) -> Result<(), Error> {
    let outputs = instance.process(batch)?;
    write_outputs(&outputs, output)?;
    stats.records_in += batch.len() as u64;
    stats.records_out += outputs.len() as u64;
    stats.batches += 1;
    batch.clear();
    fire(instance, output, stats)
}

/// Fires the due timers, until none is due (a bounded number of rounds per
/// call: a transform that keeps setting due timers makes the run fail
/// rather than spin).
fn fire(instance: &mut Instance, output: &mut impl Write, stats: &mut Stats) -> Result<(), Error> {
    for _ in 0..MAX_FIRINGS_PER_STEP {
        let (outputs, fired) = instance.fire_timers(std::time::Instant::now())?;
        if fired == 0 {
            return Ok(());
        }
        write_outputs(&outputs, output)?;
        stats.records_out += outputs.len() as u64;
        stats.timers_fired += fired as u64;
    }
    Err(Error::Runtime(crate::runtime::Error::Guest(format!(
        "timers still due after {MAX_FIRINGS_PER_STEP} rounds of firing: does `on-timers` keep setting timers at or \
         below the watermark?"
    ))))
}

/// Rounds of [`Instance::fire_timers`] after one batch or time line.
const MAX_FIRINGS_PER_STEP: usize = 1_000;

fn write_outputs(outputs: &[OutputRecord], output: &mut impl Write) -> Result<(), Error> {
    for record in outputs {
        writeln!(output, "{}", render_output(record))?;
    }
    output.flush()?;
    Ok(())
}
