/*
 * sluice._speedups: the Python SDK's per-record path, in C.
 *
 * What a record costs in a Python transform is mostly the interpreter's:
 * every Python-level call and attribute store on the way from the packed
 * batch to the packed outputs. This module owns that way, and nothing else:
 *
 * - `unpack_batch`: a `packed-batch` byte string into `Record` objects;
 * - `RecordBase`: the fields of `sluice.Record` (which subclasses it) and its
 *   `key_or_empty`;
 * - `EmitterBase`: `sluice.Emitter`'s output list and its `emit`;
 * - `ValueStateBase`: `sluice.ValueState`'s fields and its `get`, `set` and
 *   `update` (the read-modify-write) through the SDK's per-call cache
 *   (`sluice._store`);
 * - `pack_outputs`: the emitted records into one `packed-outputs` string;
 * - `batch_keys` and `prefix_keys`: the key lists `prefetch` takes;
 *   `missing` and `fill`: which of them the cache lacks, and caching the
 *   host's answer;
 * - `pack_keys`, `unpack_values` and `pack_entries`: the byte strings of
 *   `state.get-many-packed` and `state.write-packed`, through which the
 *   call cache reads and writes the host's state.
 *
 * The byte layouts are wit/sluice.wit's; the semantics are those of the
 * pure-Python code in sluice/__init__.py, which stays the reference (and
 * runs wherever this module is not built: plain CPython without a compiler).
 * The SDK's tests run against both. Everything not on the per-record path
 * (time-to-live, JSON other than integers, header conversion) calls back
 * into the Python helpers that `bind` hands over once at import.
 *
 * Built against the stable ABI of CPython 3.11 (Py_LIMITED_API), so one
 * source serves the host's Python for tests and componentize-py's CPython
 * 3.14 (wasm32-wasi) in components; see sdks/python/native/build.sh.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/*
 * Reference counts through the stable ABI's functions, never the 3.11
 * headers' inline macros: from 3.12 on, CPython hands out immortal objects
 * (None, small ints, one-byte bytes, ...) without counting the reference,
 * and an inline decrement of one would count down its refcount until it is
 * freed (after some 1.3e9 records on wasm32). Py_IncRef and Py_DecRef are
 * the running interpreter's own, which know immortality.
 */
#undef Py_INCREF
#undef Py_DECREF
#undef Py_XINCREF
#undef Py_XDECREF
#undef Py_CLEAR
#undef Py_RETURN_NONE
#define Py_INCREF(op) Py_IncRef((PyObject *)(op))
#define Py_DECREF(op) Py_DecRef((PyObject *)(op))
#define Py_XINCREF(op) Py_IncRef((PyObject *)(op)) /* both take NULL */
#define Py_XDECREF(op) Py_DecRef((PyObject *)(op))
#define Py_CLEAR(op)                                                                                                   \
    do {                                                                                                               \
        PyObject *cleared_ = (PyObject *)(op);                                                                         \
        (op) = NULL;                                                                                                   \
        Py_DecRef(cleared_);                                                                                           \
    } while (0)
#define Py_RETURN_NONE return Py_IncRef(Py_None), Py_None

/* ---------------------------------------------------------------- bound helpers */

/* Set once by `bind` (sluice/__init__.py at import). */
static PyObject *py_bytes;        /* sluice._bytes(b) -> bytes */
static PyObject *py_headers;      /* sluice._header_list(headers) -> list */
static PyObject *py_store;        /* sluice._store, for `.read(k)` on a miss */
static PyObject *py_values;       /* sluice._store.values, the cache (use_cache swaps it) */
static PyObject *py_dirty;        /* sluice._store.dirty, its unsent keys (likewise) */
static PyObject *py_decode_value; /* sluice._decode_value(name, raw) */
static PyObject *py_json_encode;  /* sluice._json_encode(value) -> bytes */

static PyObject *s_read, *s_get_ttl, *s_set_ttl, *s_update_ttl, *s_append;

static int bound(void) {
    if (py_store == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sluice._speedups used before bind()");
        return 0;
    }
    return 1;
}

/* `b` as bytes: bytes as is, str as UTF-8, anything else through _bytes. */
static PyObject *as_bytes(PyObject *b) {
    if (PyBytes_CheckExact(b)) {
        Py_INCREF(b);
        return b;
    }
    if (PyUnicode_CheckExact(b))
        return PyUnicode_AsUTF8String(b);
    if (!bound())
        return NULL;
    return PyObject_CallFunctionObjArgs(py_bytes, b, NULL);
}

/* ---------------------------------------------------------------- arguments */

/* Fills given[0..n) from a METH_FASTCALL | METH_KEYWORDS call to `fname`
 * with parameters `names`, of which the first `required` must be given;
 * the others keep what the caller put in `given` (their defaults). */
static int take_args(const char *fname, const char *const *names, int n, int required, PyObject **given,
                     PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n, nargs);
        return 0;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GetItem(kwnames, i);
        int j = 0;
        while (j < n && PyUnicode_CompareWithASCIIString(name, names[j]) != 0)
            j++;
        if (j == n) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, name);
            return 0;
        }
        if (j < nargs) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[j]);
            return 0;
        }
        given[j] = args[nargs + i];
    }
    for (int j = 0; j < required; j++)
        if (given[j] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[j]);
            return 0;
        }
    return 1;
}

/* ---------------------------------------------------------------- the types' lifecycle */

/* Every type here is a GC-tracked heap type that subclasses from Python
 * (with `__slots__ = ()`) extend: an instance is untracked, cleared with
 * its type's tp_clear, freed, and its type released. */
static void dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    inquiry clear = (inquiry)PyType_GetSlot(tp, Py_tp_clear);
    clear(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

/* ---------------------------------------------------------------- Record */

typedef struct {
    PyObject_HEAD
    PyObject *key, *value, *headers, *timestamp, *topic, *partition, *offset;
} RecordObject;

static int record_traverse(RecordObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)self));
    Py_VISIT(self->key);
    Py_VISIT(self->value);
    Py_VISIT(self->headers);
    Py_VISIT(self->timestamp);
    Py_VISIT(self->topic);
    Py_VISIT(self->partition);
    Py_VISIT(self->offset);
    return 0;
}

static int record_clear(RecordObject *self) {
    Py_CLEAR(self->key);
    Py_CLEAR(self->value);
    Py_CLEAR(self->headers);
    Py_CLEAR(self->timestamp);
    Py_CLEAR(self->topic);
    Py_CLEAR(self->partition);
    Py_CLEAR(self->offset);
    return 0;
}

static PyObject *record_key_or_empty(RecordObject *self, PyObject *unused) {
    if (self->key == NULL || self->key == Py_None)
        return PyBytes_FromStringAndSize("", 0);
    Py_INCREF(self->key);
    return self->key;
}

static PyMethodDef record_methods[] = {
    {"key_or_empty", (PyCFunction)record_key_or_empty, METH_NOARGS,
     "key_or_empty($self)\n--\n\nThe key, or ``b\"\"`` for records without one."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef record_members[] = {
    {"key", T_OBJECT_EX, offsetof(RecordObject, key), 0, NULL},
    {"value", T_OBJECT_EX, offsetof(RecordObject, value), 0, NULL},
    {"_headers", T_OBJECT_EX, offsetof(RecordObject, headers), 0, NULL},
    {"timestamp", T_OBJECT_EX, offsetof(RecordObject, timestamp), 0, NULL},
    {"topic", T_OBJECT_EX, offsetof(RecordObject, topic), 0, NULL},
    {"partition", T_OBJECT_EX, offsetof(RecordObject, partition), 0, NULL},
    {"offset", T_OBJECT_EX, offsetof(RecordObject, offset), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot record_slots[] = {
    {Py_tp_doc, "The fields of sluice.Record, kept in C."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, dealloc},
    {Py_tp_traverse, record_traverse},
    {Py_tp_clear, record_clear},
    {Py_tp_methods, record_methods},
    {Py_tp_members, record_members},
    {0, NULL},
};

static PyType_Spec record_spec = {
    "sluice._speedups.RecordBase", sizeof(RecordObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, record_slots,
};

static PyTypeObject *record_type;

/* ---------------------------------------------------------------- unpack_batch */

/* A bounds-checked reader over a packed-batch. */
typedef struct {
    const unsigned char *p;
    Py_ssize_t len, at;
} Reader;

/* Whether `n` more bytes are there. 64-bit, as counts times sizes can pass
 * Py_ssize_t's 32 bits on wasm32. */
static int need(Reader *r, uint64_t n) {
    uint64_t left = (uint64_t)(r->len - r->at);
    if (n > left) {
        PyErr_Format(PyExc_ValueError, "cut short, %llu bytes missing", (unsigned long long)(n - left));
        return 0;
    }
    return 1;
}

static uint32_t u32_at(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int read_u32(Reader *r, uint32_t *out) {
    if (!need(r, 4))
        return 0;
    *out = u32_at(r->p + r->at);
    r->at += 4;
    return 1;
}

static int read_i64(Reader *r, int64_t *out) {
    if (!need(r, 8))
        return 0;
    uint64_t v = (uint64_t)u32_at(r->p + r->at) | (uint64_t)u32_at(r->p + r->at + 4) << 32;
    *out = (int64_t)v;
    r->at += 8;
    return 1;
}

/* A length-prefixed byte string as bytes (or str when `text`). */
static PyObject *read_sized(Reader *r, int text) {
    uint32_t n;
    if (!read_u32(r, &n) || !need(r, n))
        return NULL;
    const char *s = (const char *)r->p + r->at;
    r->at += n;
    return text ? PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict") : PyBytes_FromStringAndSize(s, (Py_ssize_t)n);
}

enum { HAS_KEY = 1, HAS_VALUE = 2, HAS_TIMESTAMP = 4 };

static PyObject *empty_tuple;

/* One record's fields after its flags byte. Steals nothing; fills `rec`. */
static int read_record(Reader *r, RecordObject *rec, PyObject *topics, PyObject *partition) {
    if (!need(r, 13))
        return 0;
    unsigned flags = r->p[r->at];
    uint32_t topic = u32_at(r->p + r->at + 1);
    r->at += 5;
    int64_t offset, timestamp;
    if (!read_i64(r, &offset))
        return 0;
    if (topic >= (uint32_t)PyList_Size(topics)) {
        PyErr_Format(PyExc_ValueError, "topic index %u out of range", topic);
        return 0;
    }
    PyObject *t = PyList_GetItem(topics, topic); /* borrowed */
    Py_INCREF(t);
    rec->topic = t;
    Py_INCREF(partition);
    rec->partition = partition;
    if (!(rec->offset = PyLong_FromLongLong(offset)))
        return 0;
    if (flags & HAS_TIMESTAMP) {
        if (!read_i64(r, &timestamp) || !(rec->timestamp = PyLong_FromLongLong(timestamp)))
            return 0;
    } else {
        Py_INCREF(Py_None);
        rec->timestamp = Py_None;
    }
    if (flags & HAS_KEY) {
        if (!(rec->key = read_sized(r, 0)))
            return 0;
    } else {
        Py_INCREF(Py_None);
        rec->key = Py_None;
    }
    if (flags & HAS_VALUE) {
        if (!(rec->value = read_sized(r, 0)))
            return 0;
    } else {
        Py_INCREF(Py_None);
        rec->value = Py_None;
    }
    uint32_t count;
    if (!read_u32(r, &count))
        return 0;
    if (count == 0) {
        Py_INCREF(empty_tuple);
        rec->headers = empty_tuple;
        return 1;
    }
    /* Each header is at least 8 bytes: refuse a count the rest cannot hold
     * before allocating for it. */
    if (!need(r, (uint64_t)count * 8))
        return 0;
    PyObject *headers = PyList_New(0);
    if (!headers)
        return 0;
    rec->headers = headers;
    for (uint32_t i = 0; i < count; i++) {
        PyObject *name = read_sized(r, 1);
        PyObject *value = name ? read_sized(r, 0) : NULL;
        PyObject *pair = value ? PyTuple_Pack(2, name, value) : NULL;
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (!pair || PyList_Append(headers, pair) < 0) {
            Py_XDECREF(pair);
            return 0;
        }
        Py_DECREF(pair);
    }
    return 1;
}

static PyObject *unpack_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "unpack_batch(buf, record_type)");
        return NULL;
    }
    PyObject *buf = args[0], *cls = args[1];
    if (!PyBytes_Check(buf)) {
        PyErr_SetString(PyExc_TypeError, "unpack_batch: buf must be bytes");
        return NULL;
    }
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, record_type)) {
        PyErr_SetString(PyExc_TypeError, "unpack_batch: record_type must subclass RecordBase");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)cls, Py_tp_alloc);
    Reader r = {(const unsigned char *)PyBytes_AsString(buf), PyBytes_Size(buf), 0};
    PyObject *topics = NULL, *partition = NULL, *records = NULL;
    int64_t head;
    if (!read_i64(&r, &head)) /* partition (i32) and topic count (u32) */
        return NULL;
    if (!(partition = PyLong_FromLong((long)(int32_t)(uint32_t)head)))
        return NULL;
    uint32_t ntopics = (uint32_t)((uint64_t)head >> 32), n;
    if (!need(&r, (uint64_t)ntopics * 4) || !(topics = PyList_New(0)))
        goto fail;
    for (uint32_t i = 0; i < ntopics; i++) {
        PyObject *t = read_sized(&r, 1);
        if (!t || PyList_Append(topics, t) < 0) {
            Py_XDECREF(t);
            goto fail;
        }
        Py_DECREF(t);
    }
    /* A record is at least 17 bytes (flags, topic, offset, header count). */
    if (!read_u32(&r, &n) || !need(&r, (uint64_t)n * 17) || !(records = PyList_New(n)))
        goto fail;
    for (uint32_t i = 0; i < n; i++) {
        RecordObject *rec = (RecordObject *)alloc((PyTypeObject *)cls, 0);
        if (!rec)
            goto fail;
        PyList_SetItem(records, i, (PyObject *)rec); /* steals; the list frees it on failure */
        if (!read_record(&r, rec, topics, partition))
            goto fail;
    }
    if (r.at < r.len) {
        PyErr_Format(PyExc_ValueError, "%zd bytes after the last record", r.len - r.at);
        goto fail;
    }
    Py_DECREF(topics);
    Py_DECREF(partition);
    return records;
fail:
    Py_XDECREF(records);
    Py_XDECREF(topics);
    Py_XDECREF(partition);
    return NULL;
}

/* ---------------------------------------------------------------- Emitter */

typedef struct {
    PyObject_HEAD
    PyObject *records;
} EmitterObject;

static int emitter_traverse(EmitterObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)self));
    Py_VISIT(self->records);
    return 0;
}

static int emitter_clear(EmitterObject *self) {
    Py_CLEAR(self->records);
    return 0;
}

/* As object's: __new__ takes whatever a subclass's __init__ does, and the
 * base __init__ takes nothing. */
static PyObject *emitter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    EmitterObject *self = (EmitterObject *)alloc(type, 0);
    if (self && !(self->records = PyList_New(0)))
        Py_CLEAR(self);
    return (PyObject *)self;
}

static int emitter_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (PyTuple_Size(args) != 0 || (kwargs && PyDict_Size(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Emitter() takes no arguments");
        return -1;
    }
    return 0;
}

/* `key` or `value` as emit stores it: None, or bytes. */
static PyObject *emitted(PyObject *b) {
    if (b == Py_None) {
        Py_INCREF(b);
        return b;
    }
    return as_bytes(b);
}

static PyObject *emitter_emit(EmitterObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"key", "value", "headers", "topic"};
    PyObject *given[4] = {NULL, NULL, empty_tuple, Py_None};
    if (!take_args("emit", names, 4, 2, given, args, nargs, kwnames))
        return NULL;
    if (given[3] != Py_None && !PyUnicode_Check(given[3])) {
        PyObject *type = PyType_GetName(Py_TYPE(given[3]));
        if (type)
            PyErr_Format(PyExc_TypeError, "an output topic must be str or None, not %U", type);
        Py_XDECREF(type);
        return NULL;
    }
    PyObject *key = emitted(given[0]);
    PyObject *value = key ? emitted(given[1]) : NULL;
    PyObject *headers = NULL;
    if (value) {
        int any = PyObject_IsTrue(given[2]);
        if (any > 0)
            headers = bound() ? PyObject_CallFunctionObjArgs(py_headers, given[2], NULL) : NULL;
        else if (any == 0) {
            Py_INCREF(empty_tuple);
            headers = empty_tuple;
        }
    }
    PyObject *out = headers ? PyTuple_Pack(4, key, value, headers, given[3]) : NULL;
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    if (!out)
        return NULL;
    /* `records` is a plain attribute: deleted, or replaced by anything with
     * an `append`, it behaves as the pure-Python emitter's. */
    PyObject *records = self->records, *done = NULL;
    if (records == NULL)
        PyErr_SetString(PyExc_AttributeError, "'Emitter' object has no attribute 'records'");
    else if (PyList_CheckExact(records))
        done = PyList_Append(records, out) < 0 ? NULL : (Py_INCREF(Py_None), Py_None);
    else
        done = PyObject_CallMethodObjArgs(records, s_append, out, NULL);
    Py_DECREF(out);
    return done;
}

static PyMethodDef emitter_methods[] = {
    {"emit", (PyCFunction)(void (*)(void))emitter_emit, METH_FASTCALL | METH_KEYWORDS,
     "emit($self, key, value, headers=(), topic=None)\n--\n\n"
     "Writes a record. ``str`` is encoded as UTF-8; a ``None`` key means no\n"
     "key, a ``None`` value a tombstone; ``topic=None`` is the job's default\n"
     "output topic (any other must be one of the job's output topics)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef emitter_members[] = {
    {"records", T_OBJECT_EX, offsetof(EmitterObject, records), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot emitter_slots[] = {
    {Py_tp_doc, "The output list of sluice.Emitter and its emit, kept in C."},
    {Py_tp_new, emitter_new},
    {Py_tp_init, emitter_init},
    {Py_tp_dealloc, dealloc},
    {Py_tp_traverse, emitter_traverse},
    {Py_tp_clear, emitter_clear},
    {Py_tp_methods, emitter_methods},
    {Py_tp_members, emitter_members},
    {0, NULL},
};

static PyType_Spec emitter_spec = {
    "sluice._speedups.EmitterBase", sizeof(EmitterObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, emitter_slots,
};

/* ---------------------------------------------------------------- pack_outputs */

/* Where a packed string is written: a NULL `out` only counts. 64-bit, as
 * a batch's outputs could pass Py_ssize_t's 32 bits on wasm32. */
typedef struct {
    char *out;
    uint64_t at, cap;
} Writer;

static int put_raw(Writer *w, const void *p, uint64_t n) {
    if (w->out) {
        if (n > w->cap - w->at) { /* a header sequence changed between the passes */
            PyErr_SetString(PyExc_RuntimeError, "the data changed while it was packed");
            return 0;
        }
        memcpy(w->out + w->at, p, (size_t)n);
    }
    w->at += n;
    return 1;
}

static int put_u32(Writer *w, uint64_t n) {
    if (n > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a packed field or count passes 4 GiB");
        return 0;
    }
    unsigned char b[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 24)};
    return put_raw(w, b, 4);
}

/* A u32 length and the bytes of `b`: bytes (or any bytes-like object, as
 * b"".join takes), or with `text` a str, written as UTF-8. `what` names the
 * field in the error. */
static int put_sized(Writer *w, PyObject *b, int text, const char *what) {
    const char *p;
    Py_ssize_t n;
    PyObject *copy = NULL;
    if (text) {
        if (!PyUnicode_Check(b)) {
            PyErr_Format(PyExc_TypeError, "%s must be str", what);
            return 0;
        }
        if (!(p = PyUnicode_AsUTF8AndSize(b, &n)))
            return 0;
    } else {
        if (!PyBytes_Check(b)) {
            /* bytes-like, as b"".join takes; not any iterable of ints */
            if (!PyObject_CheckBuffer(b) || !(copy = PyBytes_FromObject(b))) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s must be bytes", what);
                return 0;
            }
            b = copy;
        }
        p = PyBytes_AsString(b);
        n = PyBytes_Size(b);
    }
    int ok = put_u32(w, (uint64_t)n) && put_raw(w, p, (uint64_t)n);
    Py_XDECREF(copy);
    return ok;
}

/* An output's headers: a count, then each (name, value) pair. */
static int put_headers(Writer *w, PyObject *headers) {
    int any = PyObject_IsTrue(headers);
    Py_ssize_t count = any > 0 ? PySequence_Size(headers) : any;
    if (count < 0 || !put_u32(w, (uint64_t)count))
        return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PySequence_GetItem(headers, i), *name = NULL, *value = NULL;
        int ok = pair && (name = PySequence_GetItem(pair, 0)) && (value = PySequence_GetItem(pair, 1)) &&
                 put_sized(w, name, 1, "an output header's name") && put_sized(w, value, 0, "an output header's value");
        Py_XDECREF(pair);
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (!ok)
            return 0;
    }
    return 1;
}

/* One emitted (key, value, headers, topic) tuple. */
static int put_output(Writer *w, PyObject *item) {
    if (!PyTuple_Check(item) || PyTuple_Size(item) != 4) {
        PyErr_SetString(PyExc_TypeError, "an output must be a (key, value, headers, topic) tuple");
        return 0;
    }
    /* The tuple is immutable and the caller holds it: its items stay put. */
    PyObject *key = PyTuple_GetItem(item, 0), *value = PyTuple_GetItem(item, 1);
    PyObject *headers = PyTuple_GetItem(item, 2), *topic = PyTuple_GetItem(item, 3);
    unsigned char flags = (key != Py_None) | (value != Py_None) << 1 | (topic != Py_None) << 2;
    return put_raw(w, &flags, 1) && (topic == Py_None || put_sized(w, topic, 1, "an output's topic")) &&
           (key == Py_None || put_sized(w, key, 0, "an output's key")) &&
           (value == Py_None || put_sized(w, value, 0, "an output's value")) && put_headers(w, headers);
}

static int put_outputs(Writer *w, PyObject *records, PyObject *unused, Py_ssize_t n) {
    if (!put_u32(w, (uint64_t)n))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Header sequences run Python code, which may change the list. */
        PyObject *item = PyList_GetItem(records, i);
        if (!item)
            return 0;
        Py_INCREF(item);
        int ok = put_output(w, item);
        Py_DECREF(item);
        if (!ok)
            return 0;
    }
    return 1;
}

/* A new bytes object of `size` for a packed string. */
static PyObject *new_packed(uint64_t size) {
    if (size > (uint64_t)PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a packed string passes the address space");
        return NULL;
    }
    return PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
}

/* Writes the n items of `list` (with `extra`, as the writer needs). */
typedef int (*put_all)(Writer *w, PyObject *list, PyObject *extra, Py_ssize_t n);

/* A packed string, written twice by `put`: once to size it, once to fill
 * it. `put` may run Python code (header sequences, bytes-like values), so
 * a second pass that differs from the first is refused. */
static PyObject *pack_twice(put_all put, PyObject *list, PyObject *extra) {
    Py_ssize_t n = PyList_Size(list);
    Writer count = {NULL, 0, 0};
    if (!put(&count, list, extra, n))
        return NULL;
    PyObject *bytes = new_packed(count.at);
    if (!bytes)
        return NULL;
    Writer fill = {PyBytes_AsString(bytes), 0, count.at};
    if (put(&fill, list, extra, n) && (fill.at != count.at || PyList_Size(list) != n))
        PyErr_SetString(PyExc_RuntimeError, "the data changed while it was packed");
    if (PyErr_Occurred()) {
        Py_DECREF(bytes);
        return NULL;
    }
    return bytes;
}

static PyObject *pack_outputs(PyObject *module, PyObject *records) {
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "pack_outputs: records must be a list");
        return NULL;
    }
    return pack_twice(put_outputs, records, NULL);
}

/* ---------------------------------------------------------------- keys */

static PyObject *batch_keys(PyObject *module, PyObject *records) {
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "batch_keys: records must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_Size(records);
    PyObject *keys = PyList_New(n), *empty = PyBytes_FromStringAndSize("", 0);
    if (!keys || !empty)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GetItem(records, i), *k;
        if (!r) /* a `key` property emptied the list */
            goto fail;
        if (PyObject_TypeCheck(r, record_type)) {
            k = ((RecordObject *)r)->key;
            if (k == NULL) {
                PyErr_SetString(PyExc_AttributeError, "key");
                goto fail;
            }
            Py_INCREF(k);
        } else {
            Py_INCREF(r);
            k = PyObject_GetAttrString(r, "key");
            Py_DECREF(r);
            if (!k)
                goto fail;
        }
        if (k == Py_None) {
            Py_DECREF(k);
            Py_INCREF(empty);
            k = empty;
        }
        PyList_SetItem(keys, i, k);
    }
    Py_DECREF(empty);
    return keys;
fail:
    Py_XDECREF(keys);
    Py_XDECREF(empty);
    return NULL;
}

/* `prefix + k` for bytes `prefix` and bytes `k`. */
static PyObject *concat(PyObject *prefix, PyObject *k) {
    if (!PyBytes_Check(prefix) || !PyBytes_Check(k)) {
        PyErr_SetString(PyExc_TypeError, "a state key must be bytes");
        return NULL;
    }
    Py_ssize_t a = PyBytes_Size(prefix), b = PyBytes_Size(k);
    PyObject *out = PyBytes_FromStringAndSize(NULL, a + b);
    if (out) {
        char *p = PyBytes_AsString(out);
        memcpy(p, PyBytes_AsString(prefix), (size_t)a);
        memcpy(p + a, PyBytes_AsString(k), (size_t)b);
    }
    return out;
}

static PyObject *prefix_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "prefix_keys(prefix: bytes, keys)");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(args[1]), *out = it ? PyList_New(0) : NULL, *k;
    if (!out)
        goto fail;
    while ((k = PyIter_Next(it))) {
        PyObject *b = as_bytes(k);
        Py_DECREF(k);
        PyObject *full = b ? concat(args[0], b) : NULL;
        Py_XDECREF(b);
        if (!full || PyList_Append(out, full) < 0) {
            Py_XDECREF(full);
            goto fail;
        }
        Py_DECREF(full);
    }
    if (PyErr_Occurred())
        goto fail;
    Py_DECREF(it);
    return out;
fail:
    Py_XDECREF(it);
    Py_XDECREF(out);
    return NULL;
}

/* ---------------------------------------------------------------- packed state calls */

/* The byte strings of state.get-many-packed and state.write-packed
 * (wit/sluice.wit): the bindings copy one string each way instead of making
 * an object per key. */

static int put_keys(Writer *w, PyObject *keys, PyObject *unused, Py_ssize_t n) {
    if (!put_u32(w, (uint64_t)n))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GetItem(keys, i);
        if (!k)
            return 0;
        Py_INCREF(k);
        int ok = put_sized(w, k, 0, "a state key");
        Py_DECREF(k);
        if (!ok)
            return 0;
    }
    return 1;
}

static PyObject *pack_keys(PyObject *module, PyObject *keys) {
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "pack_keys: keys must be a list");
        return NULL;
    }
    return pack_twice(put_keys, keys, NULL);
}

/* The values of a get-many-packed answer for `n` keys: bytes or None each. */
static PyObject *unpack_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "unpack_values(buf: bytes, n: int)");
        return NULL;
    }
    Py_ssize_t want = PyLong_AsSsize_t(args[1]);
    if (want < 0 && PyErr_Occurred())
        return NULL;
    Reader r = {(const unsigned char *)PyBytes_AsString(args[0]), PyBytes_Size(args[0]), 0};
    uint32_t n;
    if (!read_u32(&r, &n))
        return NULL;
    if ((Py_ssize_t)n != want) {
        PyErr_Format(PyExc_ValueError, "%u values for %zd keys", n, want);
        return NULL;
    }
    if (!need(&r, n)) /* a byte per value at least */
        return NULL;
    PyObject *values = PyList_New(n);
    if (!values)
        return NULL;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *v;
        if (!need(&r, 1))
            goto fail;
        unsigned char present = r.p[r.at++];
        if (present > 1) {
            PyErr_Format(PyExc_ValueError, "value %u: presence byte %u", i, present);
            goto fail;
        }
        if (present) {
            if (!(v = read_sized(&r, 0)))
                goto fail;
        } else {
            Py_INCREF(Py_None);
            v = Py_None;
        }
        PyList_SetItem(values, i, v);
    }
    if (r.at < r.len) {
        PyErr_Format(PyExc_ValueError, "%zd bytes after the last value", r.len - r.at);
        goto fail;
    }
    return values;
fail:
    Py_DECREF(values);
    return NULL;
}

static int put_entries(Writer *w, PyObject *keys, PyObject *values, Py_ssize_t n) {
    if (!put_u32(w, (uint64_t)n))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GetItem(keys, i), *v = NULL;
        if (!k)
            return 0;
        Py_INCREF(k);
        if (!(v = PyDict_GetItemWithError(values, k)) && !PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "a dirty state key is not in the cache");
        Py_XINCREF(v);
        unsigned char present = v != Py_None;
        int ok = v && put_sized(w, k, 0, "a state key") && put_raw(w, &present, 1) &&
                 (!present || put_sized(w, v, 0, "a state value"));
        Py_DECREF(k);
        Py_XDECREF(v);
        if (!ok)
            return 0;
    }
    return 1;
}

/* write-packed's entries: every key of the list `keys` with its value in
 * `values` (bytes, or None to remove). */
static PyObject *pack_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pack_entries(keys: list, values: dict)");
        return NULL;
    }
    return pack_twice(put_entries, args[0], args[1]);
}

/* ---------------------------------------------------------------- the cache's misses */

/* What a cached entry costs besides its key and value: its dict slot and
 * the two bytes objects' headers, rounded up (sluice._ENTRY_BYTES, which
 * must agree). */
#define ENTRY_BYTES 96

/* missing(keys: list, values: dict) -> list: the keys of `keys` that
 * `values` lacks, each once, in their first order: what a prefetch asks
 * the host for. */
static PyObject *missing(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "missing(keys: list, values: dict)");
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    PyObject *out = PyList_New(0), *seen = out ? PySet_New(NULL) : NULL;
    if (!seen)
        goto fail;
    /* The list's length is read on every turn: a key's __eq__ may change it. */
    for (Py_ssize_t i = 0; i < PyList_Size(keys); i++) {
        PyObject *k = PyList_GetItem(keys, i);
        if (!k)
            goto fail;
        Py_INCREF(k);
        int known = PyDict_Contains(values, k);
        if (known == 0)
            known = PySet_Contains(seen, k);
        if (known == 0 && (PySet_Add(seen, k) < 0 || PyList_Append(out, k) < 0))
            known = -1;
        Py_DECREF(k);
        if (known < 0)
            goto fail;
    }
    Py_DECREF(seen);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(seen);
    return NULL;
}

/* fill(values: dict, keys: list, got: list) -> int: caches got[i] (bytes,
 * or None for no value) under keys[i] (bytes); the bytes the cache grew
 * by, counted as _Cache counts them. */
static PyObject *fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "fill(values: dict, keys: list, got: list)");
        return NULL;
    }
    PyObject *values = args[0], *keys = args[1], *got = args[2];
    if (PyList_Size(keys) != PyList_Size(got)) {
        PyErr_Format(PyExc_ValueError, "%zd values for %zd keys", PyList_Size(got), PyList_Size(keys));
        return NULL;
    }
    Py_ssize_t added = 0;
    for (Py_ssize_t i = 0; i < PyList_Size(keys) && i < PyList_Size(got); i++) {
        PyObject *k = PyList_GetItem(keys, i), *v = PyList_GetItem(got, i);
        if (!k || !v)
            return NULL;
        if (!PyBytes_Check(k) || (v != Py_None && !PyBytes_Check(v))) {
            PyErr_Format(PyExc_TypeError, "fill: entry %zd is not a bytes key with a bytes value or None", i);
            return NULL;
        }
        Py_INCREF(k);
        Py_INCREF(v);
        int set = PyDict_SetItem(values, k, v);
        added += ENTRY_BYTES + PyBytes_Size(k) + (v == Py_None ? 0 : PyBytes_Size(v));
        Py_DECREF(k);
        Py_DECREF(v);
        if (set < 0)
            return NULL;
    }
    return PyLong_FromSsize_t(added);
}

/* ---------------------------------------------------------------- ValueState */

typedef struct {
    PyObject_HEAD
    PyObject *name, *ttl_ms, *prefix;
} ValueStateObject;

static int vs_traverse(ValueStateObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)self));
    Py_VISIT(self->name);
    Py_VISIT(self->ttl_ms);
    Py_VISIT(self->prefix);
    return 0;
}

static int vs_clear(ValueStateObject *self) {
    Py_CLEAR(self->name);
    Py_CLEAR(self->ttl_ms);
    Py_CLEAR(self->prefix);
    return 0;
}

/* The value stored as `raw` (bytes): plain non-negative integers without a
 * leading zero parse here, as _json_decode's fast path; the rest through
 * _decode_value, which raises sluice.Error for text that is not JSON. */
static PyObject *decode(PyObject *name, PyObject *raw) {
    /* (Longer digit strings go to Python, whose int() limits their length
     * and whose error _decode_value words.) */
    if (PyBytes_Check(raw)) {
        const char *s = PyBytes_AsString(raw);
        Py_ssize_t n = PyBytes_Size(raw), i = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (n > 0 && n <= 18 && i == n && (s[0] != '0' || n == 1)) {
            long long v = 0;
            for (i = 0; i < n; i++)
                v = v * 10 + (s[i] - '0');
            return PyLong_FromLongLong(v);
        }
    }
    return PyObject_CallFunctionObjArgs(py_decode_value, name, raw, NULL);
}

/* `value` as stored: ints (not bools) as their digits, the rest through _json_encode. */
static PyObject *encode(PyObject *value) {
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (n == -1 && PyErr_Occurred())
            return NULL;
        if (!overflow) {
            char digits[24], *p = digits + sizeof digits;
            unsigned long long u = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
            do
                *--p = (char)('0' + u % 10);
            while (u /= 10);
            if (n < 0)
                *--p = '-';
            return PyBytes_FromStringAndSize(p, digits + sizeof digits - p);
        }
        PyObject *text = PyObject_Str(value);
        PyObject *out = text ? PyUnicode_AsUTF8String(text) : NULL;
        Py_XDECREF(text);
        return out;
    }
    return PyObject_CallFunctionObjArgs(py_json_encode, value, NULL);
}

/* The bytes store_write added to the cache (less what it freed) since
 * take_grown(): the store counts them against what it may hold. */
static Py_ssize_t grown;

static Py_ssize_t stored_size(PyObject *v) { return PyBytes_CheckExact(v) ? PyBytes_Size(v) : 0; }

/* _store.write(k, v), inlined: a write of what the cache already has (which
 * the host holds, or which is already to be written) changes nothing. */
static int store_write(PyObject *k, PyObject *v) {
    PyObject *old = PyDict_GetItemWithError(py_values, k); /* borrowed */
    if (!old && PyErr_Occurred())
        return 0;
    /* `v` is always bytes, and `old` bytes or None (the cache holds nothing
     * else), so comparing them runs no Python code. */
    Py_ssize_t size = PyBytes_Size(v);
    if (old && PyBytes_CheckExact(old) && PyBytes_Size(old) == size &&
        memcmp(PyBytes_AsString(old), PyBytes_AsString(v), (size_t)size) == 0)
        return 1;
    Py_ssize_t growth = old ? size - stored_size(old) : ENTRY_BYTES + PyBytes_Size(k) + size;
    if (PyDict_SetItem(py_dirty, k, Py_None) < 0 || PyDict_SetItem(py_values, k, v) < 0)
        return 0;
    grown += growth;
    return 1;
}

/* _store.values[k] if cached, else _store.read(k); a new reference. */
static PyObject *store_read(PyObject *k) {
    PyObject *raw = PyDict_GetItemWithError(py_values, k); /* borrowed */
    if (raw) {
        Py_INCREF(raw);
        return raw;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallMethodObjArgs(py_store, s_read, k, NULL);
}

/* What get, set and update begin with: their two arguments into `given`
 * (`required` of them required); then, for a state with a time-to-live,
 * the Python method `ttl_method`'s result in `*k` (0: done); else the host
 * key `_prefix + key` in `*k` and a new reference to the state's name in
 * `*name` (1). -1 with an error set. The key is converted before the
 * fields are read (converting it may run Python code that changes them),
 * and the name is held for the same reason: a cache miss runs Python. */
static int vs_begin(ValueStateObject *self, const char *fname, const char *const *names, int required,
                    PyObject **given, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                    PyObject *ttl_method, PyObject **k, PyObject **name) {
    if (!take_args(fname, names, 2, required, given, args, nargs, kwnames) || !bound())
        return -1;
    if (!self->ttl_ms) {
        PyErr_SetString(PyExc_AttributeError, "ValueState is not initialised");
        return -1;
    }
    int ttl = PyObject_IsTrue(self->ttl_ms);
    if (ttl < 0)
        return -1;
    if (ttl) {
        *k = PyObject_CallMethodObjArgs((PyObject *)self, ttl_method, given[0], given[1], NULL);
        return *k ? 0 : -1;
    }
    PyObject *key = as_bytes(given[0]);
    if (!key)
        return -1;
    PyObject *prefix = self->prefix;
    if (!prefix || !self->name || !PyBytes_Check(prefix)) {
        PyErr_SetString(PyExc_TypeError, "ValueState is not initialised (its _prefix must be bytes)");
        Py_DECREF(key);
        return -1;
    }
    *k = concat(prefix, key); /* runs no Python code */
    Py_DECREF(key);
    if (!*k)
        return -1;
    *name = self->name;
    Py_INCREF(*name);
    return 1;
}

static PyObject *vs_get(ValueStateObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"key", "default"};
    PyObject *given[2] = {NULL, Py_None}, *k = NULL, *name = NULL;
    int begun = vs_begin(self, "get", names, 1, given, args, nargs, kwnames, s_get_ttl, &k, &name);
    if (begun <= 0)
        return begun < 0 ? NULL : k;
    PyObject *raw = store_read(k), *value = NULL;
    if (raw == Py_None) {
        Py_INCREF(given[1]);
        value = given[1];
    } else if (raw)
        value = decode(name, raw);
    Py_DECREF(k);
    Py_DECREF(name);
    Py_XDECREF(raw);
    return value;
}

static PyObject *vs_set(ValueStateObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"key", "value"};
    PyObject *given[2] = {NULL, NULL}, *k = NULL, *name = NULL;
    int begun = vs_begin(self, "set", names, 2, given, args, nargs, kwnames, s_set_ttl, &k, &name);
    if (begun <= 0)
        return begun < 0 ? NULL : k;
    PyObject *stored = encode(given[1]);
    int ok = stored && store_write(k, stored);
    Py_DECREF(k);
    Py_DECREF(name);
    Py_XDECREF(stored);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *vs_update(ValueStateObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"key", "f"};
    PyObject *given[2] = {NULL, NULL}, *k = NULL, *name = NULL;
    int begun = vs_begin(self, "update", names, 2, given, args, nargs, kwnames, s_update_ttl, &k, &name);
    if (begun <= 0)
        return begun < 0 ? NULL : k;
    PyObject *raw = store_read(k), *current = NULL, *next = NULL, *stored = NULL;
    if (!raw)
        goto done;
    if (raw == Py_None) {
        Py_INCREF(Py_None);
        current = Py_None;
    } else if (!(current = decode(name, raw)))
        goto done;
    if (!(next = PyObject_CallFunctionObjArgs(given[1], current, NULL)))
        goto done;
    if (!(stored = encode(next)) || !store_write(k, stored))
        Py_CLEAR(next);
done:
    Py_DECREF(k);
    Py_DECREF(name);
    Py_XDECREF(raw);
    Py_XDECREF(current);
    Py_XDECREF(stored);
    return next;
}

static PyMethodDef vs_methods[] = {
    {"get", (PyCFunction)(void (*)(void))vs_get, METH_FASTCALL | METH_KEYWORDS,
     "get($self, key, default=None)\n--\n\n"
     "The value for ``key``, or ``default`` when there is none (or it expired)."},
    {"set", (PyCFunction)(void (*)(void))vs_set, METH_FASTCALL | METH_KEYWORDS,
     "set($self, key, value)\n--\n\n"
     "Stores ``value`` for ``key``."},
    {"update", (PyCFunction)(void (*)(void))vs_update, METH_FASTCALL | METH_KEYWORDS,
     "update($self, key, f)\n--\n\n"
     "Replaces the value for ``key`` with ``f(current)`` (``current`` is\n"
     "``None`` when absent or expired) and returns the new value."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef vs_members[] = {
    {"name", T_OBJECT_EX, offsetof(ValueStateObject, name), 0, NULL},
    {"ttl_ms", T_OBJECT_EX, offsetof(ValueStateObject, ttl_ms), 0, NULL},
    {"_prefix", T_OBJECT_EX, offsetof(ValueStateObject, prefix), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot vs_slots[] = {
    {Py_tp_doc, "The fields of sluice.ValueState and its update, kept in C."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, dealloc},
    {Py_tp_traverse, vs_traverse},
    {Py_tp_clear, vs_clear},
    {Py_tp_methods, vs_methods},
    {Py_tp_members, vs_members},
    {0, NULL},
};

static PyType_Spec vs_spec = {
    "sluice._speedups.ValueStateBase", sizeof(ValueStateObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, vs_slots,
};

/* ---------------------------------------------------------------- module */

static PyObject *bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "bind(bytes, header_list, store, decode_value, json_encode)");
        return NULL;
    }
    PyObject *values = PyObject_GetAttrString(args[2], "values");
    PyObject *dirty = values ? PyObject_GetAttrString(args[2], "dirty") : NULL;
    if (!dirty || !PyDict_CheckExact(values) || !PyDict_CheckExact(dirty)) {
        if (dirty)
            PyErr_SetString(PyExc_TypeError, "bind: the store's values and dirty must be dicts");
        Py_XDECREF(values);
        Py_XDECREF(dirty);
        return NULL;
    }
    PyObject *given[] = {args[0], args[1], args[2], args[3], args[4], values, dirty};
    PyObject **slots[] = {&py_bytes, &py_headers, &py_store, &py_decode_value, &py_json_encode, &py_values, &py_dirty};
    for (int i = 0; i < 7; i++) {
        PyObject *old = *slots[i];
        Py_INCREF(given[i]);
        *slots[i] = given[i];
        Py_XDECREF(old);
    }
    Py_DECREF(values);
    Py_DECREF(dirty);
    Py_RETURN_NONE;
}

/* use_cache(values, dirty): the dicts the store's cache is now (it swaps in
 * a held shard's); as bind takes them first. */
static PyObject *use_cache(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "use_cache(values: dict, dirty: dict)");
        return NULL;
    }
    PyObject *old_values = py_values, *old_dirty = py_dirty;
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    py_values = args[0];
    py_dirty = args[1];
    Py_XDECREF(old_values);
    Py_XDECREF(old_dirty);
    Py_RETURN_NONE;
}

/* take_grown() -> int: the bytes update's writes added to the cache (less
 * what they freed) since the last call. */
static PyObject *take_grown(PyObject *module, PyObject *unused) {
    Py_ssize_t taken = grown;
    grown = 0;
    return PyLong_FromSsize_t(taken);
}

static PyMethodDef module_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(bytes, header_list, store, decode_value, json_encode): the SDK's Python helpers."},
    {"unpack_batch", (PyCFunction)(void (*)(void))unpack_batch, METH_FASTCALL,
     "unpack_batch(buf, record_type) -> list: the records of a packed-batch; ValueError if malformed."},
    {"pack_outputs", (PyCFunction)pack_outputs, METH_O,
     "pack_outputs(records) -> bytes: (key, value, headers, topic) tuples as packed-outputs."},
    {"batch_keys", (PyCFunction)batch_keys, METH_O,
     "batch_keys(records) -> list: every record's key, b\"\" for none."},
    {"pack_keys", (PyCFunction)pack_keys, METH_O, "pack_keys(keys) -> bytes: get-many-packed's keys."},
    {"unpack_values", (PyCFunction)(void (*)(void))unpack_values, METH_FASTCALL,
     "unpack_values(buf, n) -> list: get-many-packed's answer; ValueError if malformed."},
    {"pack_entries", (PyCFunction)(void (*)(void))pack_entries, METH_FASTCALL,
     "pack_entries(keys, values) -> bytes: write-packed's entries, each key's value from the dict."},
    {"prefix_keys", (PyCFunction)(void (*)(void))prefix_keys, METH_FASTCALL,
     "prefix_keys(prefix, keys) -> list: prefix + each key as bytes."},
    {"missing", (PyCFunction)(void (*)(void))missing, METH_FASTCALL,
     "missing(keys, values) -> list: the keys the dict lacks, each once, in order."},
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "fill(values, keys, got) -> int: caches each key's value; the bytes the cache grew by."},
    {"use_cache", (PyCFunction)(void (*)(void))use_cache, METH_FASTCALL,
     "use_cache(values, dirty): the dicts of the store's cache from now on."},
    {"take_grown", take_grown, METH_NOARGS,
     "take_grown() -> int: bytes update's writes added to the cache since the last call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sluice._speedups", "The Python SDK's per-record path, in C.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

static int add_type(PyObject *m, PyType_Spec *spec, const char *name, PyTypeObject **keep) {
    PyObject *t = PyType_FromSpec(spec);
    if (!t)
        return 0;
    if (keep) {
        Py_INCREF(t);
        *keep = (PyTypeObject *)t;
    }
    return PyModule_AddObject(m, name, t) == 0 || (Py_DECREF(t), 0);
}

PyMODINIT_FUNC PyInit__speedups(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (!(empty_tuple = PyTuple_New(0)) || !(s_read = PyUnicode_InternFromString("read")) ||
        !(s_append = PyUnicode_InternFromString("append")) ||
        !(s_get_ttl = PyUnicode_InternFromString("_get_ttl")) ||
        !(s_set_ttl = PyUnicode_InternFromString("_set_ttl")) ||
        !(s_update_ttl = PyUnicode_InternFromString("_update_ttl")) ||
        !add_type(m, &record_spec, "RecordBase", &record_type) || !add_type(m, &emitter_spec, "EmitterBase", NULL) ||
        !add_type(m, &vs_spec, "ValueStateBase", NULL) || PyModule_AddIntConstant(m, "ENTRY_BYTES", ENTRY_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
