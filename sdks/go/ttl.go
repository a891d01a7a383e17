package sluice

// Time-to-live for [ValueState] and [MapState]: entries that expire a fixed
// processing time after they were last written.
//
// A state with a TTL stores each value as the JSON array
// `[expires_at_ms,value]`, and each write also sets a processing-time timer
// at expires_at whose key is ttlTimerPrefix followed by the entry's state
// key. Reads treat an entry at or past its expiry as absent; when the timer
// fires, the SDK (before the transform's OnTimer sees anything) deletes the
// entry unless it was written again since, so the state's bytes go down.
// The same layout as the Rust SDK's state/ttl.rs and the Python SDK's.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// ttlTimerPrefix is the first bytes of every expiry timer's key, followed by
// the entry's state key (no state name is empty, so window timers never
// begin with them).
const ttlTimerPrefix = "\x00ttl\x00"

// ttlMillis is d in whole ms (negative stays negative: an error on use).
func ttlMillis(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

func errNegativeTTL(name string) error {
	return fmt.Errorf("state `%s`: the time-to-live must not be negative", name)
}

// ttlEncode is the stored form of value under state key k: its JSON, or
// with a TTL `[expires_at,value]`, with its expiry timer set.
func ttlEncode[T any](name string, ttl int64, k string, value T) ([]byte, error) {
	if ttl < 0 {
		return nil, errNegativeTTL(name)
	}
	v, err := encode(value)
	if err != nil {
		return nil, fmt.Errorf("state `%s`: %w", name, err)
	}
	if ttl == 0 {
		return v, nil
	}
	expiresAt := satAdd(ProcessingTime(), ttl)
	ProcessingTimer([]byte(ttlTimerPrefix+k), expiresAt).Set()
	out := make([]byte, 0, len(v)+24)
	out = append(out, '[')
	out = strconv.AppendInt(out, expiresAt, 10)
	out = append(out, ',')
	out = append(out, v...)
	return append(out, ']'), nil
}

// ttlParse splits `[expires_at, value]`; ok is false if raw is not that.
func ttlParse(raw []byte) (expiresAt int64, value json.RawMessage, ok bool) {
	var pair []json.RawMessage
	if json.Unmarshal(raw, &pair) != nil || len(pair) != 2 {
		return 0, nil, false
	}
	first := bytes.TrimSpace(pair[0])
	if !plainInt(first, true) {
		return 0, nil, false
	}
	n, err := strconv.ParseInt(string(first), 10, 64)
	if err != nil {
		return 0, nil, false
	}
	return n, pair[1], true
}

// ttlDecode is the value stored as raw with a TTL; ok false once it has
// expired.
func ttlDecode[T any](name string, raw []byte) (value T, ok bool, err error) {
	expiresAt, v, parsed := ttlParse(raw)
	if !parsed {
		if !json.Valid(raw) {
			var any_ any
			return value, false, invalidJSON(name, any_, json.Unmarshal(raw, &any_))
		}
		return value, false, fmt.Errorf("state `%s`: invalid JSON: expected [expires_at, value], a state with a time-to-live", name)
	}
	if expiresAt <= ProcessingTime() {
		return value, false, nil
	}
	if err := decode(v, &value); err != nil {
		return value, false, invalidJSON(name, value, err)
	}
	return value, true, nil
}

// ttlLive reports whether raw, stored with a TTL, has not expired.
func ttlLive(name string, raw []byte) (bool, error) {
	expiresAt, _, parsed := ttlParse(raw)
	if !parsed {
		return false, fmt.Errorf("state `%s`: invalid JSON: expected [expires_at, value], a state with a time-to-live", name)
	}
	return expiresAt > ProcessingTime(), nil
}

// expire handles timer if it is an expiry timer: deletes its entry unless
// it was written again with a later expiry, and returns true; false for any
// other timer.
func expire(timer *Timer) (bool, error) {
	if timer.Clock != ClockProcessing || !bytes.HasPrefix(timer.Key, []byte(ttlTimerPrefix)) {
		return false, nil
	}
	key := string(timer.Key[len(ttlTimerPrefix):])
	s := cache.read(key)
	if s.present {
		if expiresAt, _, ok := ttlParse(s.value); ok && expiresAt <= timer.At {
			cache.write(key, nil, false)
		}
	}
	return true, nil
}
