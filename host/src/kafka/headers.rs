//! Reading a consumed record's headers without trusting them.
//!
//! rdkafka 0.39's `Headers::try_get` unwraps the header key's UTF-8
//! conversion, so one record produced with a non-UTF-8 header key panics
//! the consuming thread: any producer could stop any job. Here the headers
//! are read through librdkafka's C API, which hands out the key's bytes,
//! and a key that is not UTF-8 is converted lossily (U+FFFD for each bad
//! sequence): the record is processed, never refused or dropped.

use std::ffi::{CStr, c_char, c_void};

use rdkafka::bindings as rd;
use rdkafka::message::BorrowedMessage;

use crate::record::Header;

/// The headers of `message`, in order; a null value becomes empty.
pub(super) fn read(message: &BorrowedMessage<'_>) -> Vec<Header> {
    read_from(message.ptr())
}

/// The headers of a live message, as [`read`]: `message` must stay valid
/// for the call (the caller holds it).
#[allow(unsafe_code)]
pub(super) fn read_from(message: *const rd::rd_kafka_message_t) -> Vec<Header> {
    let mut headers: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `message` is a live rd_kafka_message_t for the call;
    // librdkafka stores a pointer to the headers it owns (parsed lazily,
    // freed with the message) into `headers`.
    let err = unsafe { rd::rd_kafka_message_headers(message, &mut headers) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || headers.is_null() {
        return Vec::new(); // RD_KAFKA_RESP_ERR__NOENT: the record has none.
    }
    // SAFETY: `headers` is valid while `message` is (see above).
    let count = unsafe { rd::rd_kafka_header_cnt(headers) };
    let mut out = Vec::with_capacity(count);
    for index in 0..count {
        let mut name: *const c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `index` < count; librdkafka writes pointers into its own
        // storage, valid while `message` is: the key NUL-terminated, the
        // value `size` bytes long or null.
        let err = unsafe { rd::rd_kafka_header_get_all(headers, index, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: as above; both are copied before `message` can go away.
        let (key, value) = unsafe {
            let key = CStr::from_ptr(name).to_bytes();
            let value = if value.is_null() { &[][..] } else { std::slice::from_raw_parts(value.cast::<u8>(), size) };
            (key, value)
        };
        out.push(Header { key: String::from_utf8_lossy(key).into_owned(), value: value.to_vec() });
    }
    out
}
