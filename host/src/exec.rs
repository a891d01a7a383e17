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

/// Parses one input line (`index` is its 0-based position among records).
pub fn parse_record(line: &str, index: usize) -> Result<InputRecord, String> {
    let input: JsonInput = serde_json::from_str(line).map_err(|e| e.to_string())?;
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
/// outputs to `output`, flushing after each batch.
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
    for (line_no, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record = parse_record(&line, index).map_err(|message| Error::Input { line: line_no + 1, message })?;
        index += 1;
        batch.push(record);
        if batch.len() == batch_size {
            flush_batch(instance, &mut batch, &mut output, &mut stats)?;
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
    for record in &outputs {
        writeln!(output, "{}", render_output(record))?;
    }
    output.flush()?;
    stats.records_in += batch.len() as u64;
    stats.records_out += outputs.len() as u64;
    stats.batches += 1;
    batch.clear();
    Ok(())
}
