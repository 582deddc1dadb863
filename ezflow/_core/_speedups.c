/* ezflow._core._speedups: the compiled twin of the codec's small-message encode.
 *
 * Optional: setup.py builds it when a C compiler is there; without one (or with
 * EZFLOW_PURE_PYTHON=1) ezflow runs the pure-Python path, which stays the reference.
 * ezflow/_core/_compiled.py chooses, once, at import.
 *
 * Template(kind, container, count, names, getter, types, slots, prefix, max_empty)
 *   The compiled form of ezflow._core._codec._templates._Template for shapes of at most
 *   one array and no numpy scalar. Its encode_small(obj, limit) returns exactly what
 *   the pure-Python _Template.encode_small(obj, limit) returns: the whole body as one
 *   bytes object, or None when the general path must decide (another shape, an int out
 *   of msgpack's range, a str that is not Unicode, a body over the limit or over
 *   SMALL_BODY). An exception raised while reading the message (a dataclass field that
 *   is missing, a dict key whose __eq__ raises) propagates as it does there. Names are
 *   packed once; a dataclass whose fields are all __slots__ members has them read at
 *   their offsets while its class is unchanged (see template_slots, slots_hold).
 *   tests/test_speedups.py pins the two together (hypothesis). Its check(obj) is
 *   Codec.validate's fast path: True only where the general check
 *   (_general._check) raises nothing for obj, False where that check must decide.
 *
 * Wire layout (ezflow/_core/_codec/_format.py): u8 version | u8 flags | u16 nbuf |
 * u32 meta_len | nbuf x u64 buffer length | meta (msgpack) | padding to 16 | buffer.
 * All header fields little endian, msgpack fields big endian; written and read byte by
 * byte (no unaligned loads or stores).
 *
 * Layout(size, mask, fixed, codes, spec, frombuffer, ndarray)
 *   The compiled form of ezflow._core._codec._layouts._Layout (a decode layout learned
 *   from a body). Its decode(body) returns exactly what _Layout.decode_py(body) returns:
 *   the message, or None when the body does not match the layout or a value is invalid
 *   (a str that is not UTF-8, a constructor that raises: the general decoder then says
 *   what is wrong). spec and codes are described in _layouts.py (_Message, _Item).
 *
 * small_frames(data, start, end, max_frame_size, slice_below)
 *   The read loop's split of a read (ezflow/_transports/_stream_channel.py): the whole
 *   small DATA frames at the front of data[start:end], as a list of (frame end, seq,
 *   body bytes, drops, sent_ns), exactly as _small_frames_py gives them.
 *
 * run_frames(frames, index, size, decode, upstream, lossless, pending_append, appends,
 *            buckets, now_ns, mask, progress, clock, decode_buckets)
 *   The loop of Channel.deliver_run: those frames decoded (one in mask + 1 timed) and
 *   queued in every inbox until the first that needs the general path, exactly as
 *   ezflow._core._channel_run.run_frames_py does it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX >= 0x030C0000
#define EZ_T_OBJECT_EX Py_T_OBJECT_EX
#define EZ_READONLY Py_READONLY
#else
#include <structmember.h>
#define EZ_T_OBJECT_EX T_OBJECT_EX
#define EZ_READONLY READONLY
#endif
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sched.h>
#include <sys/resource.h>
#endif

#define FORMAT_VERSION 1
#define SMALL_BODY 4096
#define INLINE_BYTES_LIMIT 1024
#define BUFFER_ALIGNMENT 16
#define EXT_TUPLE 1
#define EXT_NDARRAY 2
#define EXT_DATACLASS 6
#define MAX_NDIM 64
#define TEMPLATE_MAX_ITEMS 64 /* _templates._TEMPLATE_MAX_ITEMS (tests/test_speedups.py) */

/* container kinds */
enum { C_TUPLE = 0, C_LIST = 1, C_DICT = 2, C_DATACLASS = 3 };
/* item kinds */
enum { I_NONE = 0, I_BOOL = 1, I_INT = 2, I_FLOAT = 3, I_STR = 4, I_BYTES = 5, I_ARRAY = 6 };

typedef struct {
    PyObject_HEAD
    PyObject *kind;      /* the container type (exact) */
    int container;       /* C_* */
    Py_ssize_t count;    /* items */
    PyObject *names;     /* tuple of str (dict keys, dataclass fields) or None */
    PyObject *types;     /* tuple of item types (exact) */
    int *item_kinds;     /* I_* per item */
    Py_ssize_t array_at; /* index of the array item, -1: none */
    PyObject *dtype;     /* the array's dtype */
    Py_ssize_t ndim;     /* the array's ndim */
    PyObject *descr;     /* bytes: the array's packed descr */
    PyObject *prefix;    /* bytes: a dataclass's prefix (b"\x92" + packed name), or b"" */
    long long max_empty; /* _MAX_EMPTY_ITEMS */
    PyObject *packed_names; /* tuple of bytes: each name packed as msgpack packs it, or
                             * NULL (sequences; a name that is not Unicode: no match) */
    /* C_DATACLASS whose fields are all __slots__ members: per item the member's offset
     * in the instance, read directly while the class is what it was (its version tag;
     * after a change, the same descriptors found again and the generic __getattribute__);
     * else NULL, and the fields are read with getattr. */
    Py_ssize_t *slots;
    PyObject *descrs;     /* tuple: the member descriptors, as found */
    unsigned int version; /* the class's tp_version_tag when they were */
    int slots_ok;         /* whether they still are */
    int names_unpackable; /* a name is not Unicode (lone surrogates) */
} TemplateObject;

static PyObject *str_dtype, *str_shape, *str_nbytes, *str_tobytes;
/* What a fields layout looks up on its class (see fields_hold). */
static PyObject *str_init, *str_new, *str_setattr;

/* ---------------------------------------------------------------- a byte writer */

typedef struct {
    unsigned char *p;
    unsigned char *end;
} Out;

static inline int room(Out *o, Py_ssize_t n) { return o->end - o->p >= n; }

static inline int put1(Out *o, unsigned char b) {
    if (!room(o, 1)) return 0;
    *o->p++ = b;
    return 1;
}

static inline int put_be(Out *o, unsigned char marker, uint64_t v, int size) {
    if (!room(o, 1 + size)) return 0;
    *o->p++ = marker;
    for (int i = size - 1; i >= 0; i--) *o->p++ = (unsigned char)(v >> (8 * i));
    return 1;
}

static inline int put_raw(Out *o, const void *data, Py_ssize_t n) {
    if (!room(o, n)) return 0;
    if (n) memcpy(o->p, data, (size_t)n);
    o->p += n;
    return 1;
}

/* The value of the exact int *v* when it has at most 60 bits (three 30-bit digits
 * below 2**63 on 3.11; one digit on 3.12+): 1 and *out set, else 0 (take the general
 * conversion). The counters and stamps the message path reads are such ints, and
 * PyLong_AsLongLongAndOverflow costs several times this. */
static inline int small_ll(PyObject *v, long long *out) {
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)v)) {
        *out = (long long)PyUnstable_Long_CompactValue((PyLongObject *)v);
        return 1;
    }
    return 0;
#else
#if PYLONG_BITS_IN_DIGIT != 30
    return 0;
#else
    Py_ssize_t size = Py_SIZE(v);
    const digit *d = ((PyLongObject *)v)->ob_digit;
    Py_ssize_t n = size < 0 ? -size : size;
    unsigned long long u;
    switch (n) {
    case 0: *out = 0; return 1;
    case 1: u = d[0]; break;
    case 2: u = ((unsigned long long)d[1] << 30) | d[0]; break;
    case 3:
        if (d[2] >= 8) return 0; /* (2**63 and up) */
        u = ((unsigned long long)d[2] << 60) | ((unsigned long long)d[1] << 30) | d[0];
        break;
    default: return 0;
    }
    *out = size < 0 ? -(long long)u : (long long)u;
    return 1;
#endif
#endif
}

/* msgpack's int, as msgpack-python packs it (smallest form; unsigned markers for
 * non-negative values). 0: no room. */
static int pack_int64(Out *o, long long d) {
    if (d < -(1LL << 5)) {
        if (d < -(1LL << 15)) {
            if (d < -(1LL << 31)) return put_be(o, 0xd3, (uint64_t)d, 8);
            return put_be(o, 0xd2, (uint64_t)(uint32_t)(int32_t)d, 4);
        }
        if (d < -(1LL << 7)) return put_be(o, 0xd1, (uint64_t)(uint16_t)(int16_t)d, 2);
        return put_be(o, 0xd0, (uint64_t)(uint8_t)(int8_t)d, 1);
    }
    if (d < (1LL << 7)) return put1(o, (unsigned char)(int8_t)d);
    if (d < (1LL << 16)) {
        if (d < (1LL << 8)) return put_be(o, 0xcc, (uint64_t)d, 1);
        return put_be(o, 0xcd, (uint64_t)d, 2);
    }
    if (d < (1LL << 32)) return put_be(o, 0xce, (uint64_t)d, 4);
    return put_be(o, 0xcf, (uint64_t)d, 8);
}

static int pack_len(Out *o, Py_ssize_t n, int fix, int fix_max, unsigned char m16,
                    unsigned char m32) {
    if (n < fix_max) return put1(o, (unsigned char)(fix | n));
    if (n < 0x10000) return put_be(o, m16, (uint64_t)n, 2);
    return put_be(o, m32, (uint64_t)n, 4);
}

static int pack_str_header(Out *o, Py_ssize_t n) {
    if (n < 32) return put1(o, (unsigned char)(0xa0 | n));
    if (n < 0x100) return put_be(o, 0xd9, (uint64_t)n, 1);
    if (n < 0x10000) return put_be(o, 0xda, (uint64_t)n, 2);
    return put_be(o, 0xdb, (uint64_t)n, 4);
}

static int pack_ext_header(Out *o, Py_ssize_t n, int code) {
    int ok;
    switch (n) {
    case 1: ok = put1(o, 0xd4); break;
    case 2: ok = put1(o, 0xd5); break;
    case 4: ok = put1(o, 0xd6); break;
    case 8: ok = put1(o, 0xd7); break;
    case 16: ok = put1(o, 0xd8); break;
    default:
        if (n < 0x100) ok = put_be(o, 0xc7, (uint64_t)n, 1);
        else if (n < 0x10000) ok = put_be(o, 0xc8, (uint64_t)n, 2);
        else ok = put_be(o, 0xc9, (uint64_t)n, 4);
    }
    return ok && put1(o, (unsigned char)code);
}

static int pack_ustr(Out *o, PyObject *s, int *failed) {
    Py_ssize_t n;
    const char *data = PyUnicode_AsUTF8AndSize(s, &n);
    if (data == NULL) { /* not Unicode (lone surrogates): the general path says so */
        PyErr_Clear();
        *failed = 1;
        return 0;
    }
    return pack_str_header(o, n) && put_raw(o, data, n);
}

/* ---------------------------------------------------------------- Template */

static void Template_dealloc(TemplateObject *self) {
    Py_XDECREF(self->kind);
    Py_XDECREF(self->names);
    Py_XDECREF(self->types);
    Py_XDECREF(self->dtype);
    Py_XDECREF(self->descr);
    Py_XDECREF(self->prefix);
    Py_XDECREF(self->packed_names);
    Py_XDECREF(self->descrs);
    PyMem_Free(self->slots);
    PyMem_Free(self->item_kinds);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Sets self->slots and self->descrs where every field of the dataclass template is a
 * __slots__ member (an object member of a class *kind* derives from) and the class reads
 * attributes with the generic __getattribute__: then getattr(obj, name) is exactly the
 * member's value, or AttributeError where it is unset. Else leaves them NULL (the fields
 * are read with getattr). 0, or -1 with an error set. */
static int template_slots(TemplateObject *self) {
    PyTypeObject *tp = (PyTypeObject *)self->kind;
    Py_ssize_t count = self->count;
    if (tp->tp_getattro != PyObject_GenericGetAttr) return 0;
    PyObject *descrs = PyTuple_New(count);
    Py_ssize_t *slots = PyMem_Calloc((size_t)count, sizeof(Py_ssize_t));
    if (descrs == NULL || slots == NULL) {
        Py_XDECREF(descrs);
        PyMem_Free(slots);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *d = _PyType_Lookup(tp, PyTuple_GET_ITEM(self->names, i)); /* (borrowed) */
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            !PyType_IsSubtype(tp, PyDescr_TYPE(d))) {
            Py_DECREF(descrs);
            PyMem_Free(slots);
            return 0;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)d)->d_member;
        if (member->type != EZ_T_OBJECT_EX || (member->flags & ~EZ_READONLY) != 0) {
            Py_DECREF(descrs);
            PyMem_Free(slots);
            return 0;
        }
        slots[i] = member->offset;
        Py_INCREF(d);
        PyTuple_SET_ITEM(descrs, i, d);
    }
    self->slots = slots;
    self->descrs = descrs;
    self->version = (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ? tp->tp_version_tag : 0;
    self->slots_ok = 1;
    return 0;
}

/* Whether the slots of a dataclass template may be read directly: the class unchanged
 * since (its version tag: one compare), or, after a change, the same member descriptors
 * found again and still the generic __getattribute__. */
static int slots_hold(TemplateObject *self) {
    PyTypeObject *tp = (PyTypeObject *)self->kind;
    if ((tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag == self->version)
        return self->slots_ok;
    int ok = tp->tp_getattro == PyObject_GenericGetAttr;
    for (Py_ssize_t i = 0; ok && i < self->count; i++)
        ok = _PyType_Lookup(tp, PyTuple_GET_ITEM(self->names, i)) ==
             PyTuple_GET_ITEM(self->descrs, i);
    self->slots_ok = ok;
    if (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) self->version = tp->tp_version_tag;
    return ok;
}

static PyObject *Template_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kind",   "container", "names",  "types", "item_kinds",
                             "dtype",  "ndim",      "descr",  "prefix", "max_empty", NULL};
    PyObject *kind, *names, *types, *item_kinds, *dtype, *descr, *prefix;
    int container;
    Py_ssize_t ndim;
    long long max_empty;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OiOO!O!OnO!O!L", kwlist, &kind, &container,
                                     &names, &PyTuple_Type, &types, &PyTuple_Type, &item_kinds,
                                     &dtype, &ndim, &PyBytes_Type, &descr, &PyBytes_Type,
                                     &prefix, &max_empty))
        return NULL;
    if (!PyType_Check(kind)) {
        PyErr_SetString(PyExc_TypeError, "kind must be a type");
        return NULL;
    }
    if (container < C_TUPLE || container > C_DATACLASS) {
        PyErr_Format(PyExc_ValueError, "unknown container kind %d", container);
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(types);
    if (PyTuple_GET_SIZE(item_kinds) != count) {
        PyErr_SetString(PyExc_ValueError, "types and item_kinds differ in length");
        return NULL;
    }
    if (container >= C_DICT) {
        if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != count) {
            PyErr_SetString(PyExc_ValueError, "names must be a tuple of one str per item");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i))) {
                PyErr_SetString(PyExc_ValueError, "names must be str");
                return NULL;
            }
        }
    }
    if (count > TEMPLATE_MAX_ITEMS) {
        PyErr_Format(PyExc_ValueError, "%zd items: a template has at most %d", count,
                     TEMPLATE_MAX_ITEMS);
        return NULL;
    }
    if (ndim < 0 || ndim > MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "ndim %zd out of range", ndim);
        return NULL;
    }
    TemplateObject *self = (TemplateObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->item_kinds = PyMem_Calloc((size_t)(count ? count : 1), sizeof(int));
    if (self->item_kinds == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->array_at = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *tp = PyTuple_GET_ITEM(types, i);
        long k = PyLong_AsLong(PyTuple_GET_ITEM(item_kinds, i));
        if (k == -1 && PyErr_Occurred()) goto fail;
        if (!PyType_Check(tp) || k < I_NONE || k > I_ARRAY) {
            PyErr_Format(PyExc_ValueError, "bad item %zd", i);
            goto fail;
        }
        if (k == I_ARRAY) {
            if (self->array_at >= 0) {
                PyErr_SetString(PyExc_ValueError, "at most one array");
                goto fail;
            }
            self->array_at = i;
        }
        self->item_kinds[i] = (int)k;
    }
    self->container = container;
    self->count = count;
    Py_INCREF(kind);
    self->kind = kind;
    Py_INCREF(names);
    self->names = names;
    Py_INCREF(types);
    self->types = types;
    Py_INCREF(dtype);
    self->dtype = dtype;
    self->ndim = ndim;
    Py_INCREF(descr);
    self->descr = descr;
    Py_INCREF(prefix);
    self->prefix = prefix;
    self->max_empty = max_empty;
    if (container >= C_DICT) {
        /* the names packed once (a name that is not Unicode packs to nothing: every
         * message of this shape then goes to the general path, which says so) */
        self->packed_names = PyTuple_New(count);
        if (self->packed_names == NULL) goto fail;
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t n;
            const char *data = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(names, i), &n);
            if (data == NULL) {
                PyErr_Clear();
                Py_CLEAR(self->packed_names);
                self->names_unpackable = 1;
                break;
            }
            unsigned char head[5];
            Out h = {head, head + sizeof head};
            pack_str_header(&h, n);
            PyObject *packed = PyBytes_FromStringAndSize(NULL, (h.p - head) + n);
            if (packed == NULL) goto fail;
            memcpy(PyBytes_AS_STRING(packed), head, (size_t)(h.p - head));
            memcpy(PyBytes_AS_STRING(packed) + (h.p - head), data, (size_t)n);
            PyTuple_SET_ITEM(self->packed_names, i, packed);
        }
    }
    if (container == C_DATACLASS && count && template_slots(self) < 0) goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* The msgpack form of int *v*, as msgpack-python packs it: 1 with *d (int64), 2 with *u
 * (above int64, up to uint64), 0 out of that range (msgpack raises OverflowError: the
 * general path says so), -1 with an error set. The one rule of an int's range here, for
 * encode_small and check. */
static int msgpack_int(PyObject *v, long long *d, unsigned long long *u) {
    int overflow = 0;
    if (PyLong_CheckExact(v) && small_ll(v, d)) return 1;
    *d = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (*d == -1 && PyErr_Occurred()) return -1;
    if (overflow == 0) return 1;
    if (overflow < 0) return 0; /* below int64 */
    *u = PyLong_AsUnsignedLongLong(v);
    if (*u == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* above uint64 */
        return 0;
    }
    return 2;
}

/* Pack one item (type already checked). 1: done; 0: give up (None); -1: error set. */
static int pack_item(TemplateObject *self, Py_ssize_t i, PyObject *v, Out *o,
                     Py_ssize_t shape_n, const long long *shape) {
    int failed = 0;
    switch (self->item_kinds[i]) {
    case I_NONE:
        return put1(o, 0xc0);
    case I_BOOL:
        return put1(o, v == Py_True ? 0xc3 : 0xc2);
    case I_INT: {
        long long d;
        unsigned long long u;
        switch (msgpack_int(v, &d, &u)) {
        case 1: return pack_int64(o, d);
        case 2: return put_be(o, 0xcf, (uint64_t)u, 8);
        case 0: return 0;
        default: return -1;
        }
    }
    case I_FLOAT: {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, sizeof bits);
        return put_be(o, 0xcb, bits, 8);
    }
    case I_STR: {
        int ok = pack_ustr(o, v, &failed);
        return failed ? 0 : ok;
    }
    case I_BYTES: {
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        if (n >= INLINE_BYTES_LIMIT) return 0;
        int ok = n < 0x100 ? put_be(o, 0xc4, (uint64_t)n, 1) : put_be(o, 0xc5, (uint64_t)n, 2);
        return ok && put_raw(o, PyBytes_AS_STRING(v), n);
    }
    case I_ARRAY: {
        /* EXT_NDARRAY: u32 buffer index (0) | u8 ndim | ndim x u64 shape | descr */
        Py_ssize_t dlen = PyBytes_GET_SIZE(self->descr);
        Py_ssize_t plen = 5 + 8 * shape_n + dlen;
        if (!pack_ext_header(o, plen, EXT_NDARRAY) || !room(o, plen)) return 0;
        memset(o->p, 0, 4);
        o->p[4] = (unsigned char)shape_n;
        o->p += 5;
        for (Py_ssize_t k = 0; k < shape_n; k++) {
            uint64_t d = (uint64_t)shape[k];
            for (int b = 0; b < 8; b++) *o->p++ = (unsigned char)(d >> (8 * b));
        }
        return put_raw(o, PyBytes_AS_STRING(self->descr), dlen);
    }
    }
    return 0;
}

/* The items of obj, as count new references in items[] (checked: container, length,
 * keys). 1: done; 0: not of this shape; -1: error set (nothing left in items[]). */
static int items_of(TemplateObject *self, PyObject *obj, PyObject **items) {
    Py_ssize_t count = self->count;
    switch (self->container) {
    case C_TUPLE:
    case C_LIST: {
        Py_ssize_t n = self->container == C_TUPLE ? PyTuple_GET_SIZE(obj) : PyList_GET_SIZE(obj);
        if (n != count) return 0;
        PyObject **src = self->container == C_TUPLE ? &PyTuple_GET_ITEM(obj, 0)
                                                    : ((PyListObject *)obj)->ob_item;
        for (Py_ssize_t i = 0; i < count; i++) {
            items[i] = src[i];
            Py_INCREF(items[i]);
        }
        return 1;
    }
    case C_DICT: {
        /* len(obj) != count or tuple(obj) != NAMES, then obj.values() unpacked */
        if (PyDict_GET_SIZE(obj) != count) return 0;
        PyObject *keys = PySequence_Tuple(obj);
        if (keys == NULL) return -1;
        int ne = PyObject_RichCompareBool(keys, self->names, Py_NE);
        Py_DECREF(keys);
        if (ne < 0) return -1;
        if (ne) return 0;
        Py_ssize_t pos = 0, i = 0, n = PyDict_GET_SIZE(obj);
        PyObject *key, *value;
        if (n != count) { /* (a key's __eq__ changed the dict meanwhile) */
            if (n > count)
                PyErr_Format(PyExc_ValueError, "too many values to unpack (expected %zd)",
                             count);
            else
                PyErr_Format(PyExc_ValueError,
                             "not enough values to unpack (expected %zd, got %zd)", count, n);
            return -1;
        }
        while (PyDict_Next(obj, &pos, &key, &value)) {
            Py_INCREF(value);
            items[i++] = value;
        }
        return 1;
    }
    default: /* C_DATACLASS: attrgetter(*names)(obj) */
        if (self->slots != NULL && slots_hold(self)) {
            /* (the members' values: what getattr returns; an unset one raises there) */
            Py_ssize_t i = 0;
            for (; i < count; i++) {
                PyObject *v = *(PyObject **)((char *)obj + self->slots[i]);
                if (v == NULL) break;
                Py_INCREF(v);
                items[i] = v;
            }
            if (i == count) return 1;
            for (Py_ssize_t k = 0; k < i; k++) Py_DECREF(items[k]);
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *v = PyObject_GetAttr(obj, PyTuple_GET_ITEM(self->names, i));
            if (v == NULL) {
                for (Py_ssize_t k = 0; k < i; k++) Py_DECREF(items[k]);
                return -1;
            }
            items[i] = v;
        }
        return 1;
    }
}

/* An array item's shape (checked against dtype and ndim), nbytes and data. 1: ok;
 * 0: not of this shape; -1: error set. On 1, *data is a new reference (bytes) or NULL
 * with *view filled (release it). */
static int array_of(TemplateObject *self, PyObject *arr, long long *shape, Py_ssize_t *nbytes,
                    Py_buffer *view, PyObject **data) {
    int result = -1;
    PyObject *dtype = NULL, *shp = NULL, *nb = NULL;
    *data = NULL;
    view->obj = NULL;
    dtype = PyObject_GetAttr(arr, str_dtype);
    if (dtype == NULL) goto done;
    if (dtype != self->dtype) { /* (d is A.dtype or d == A.dtype) */
        int eq = PyObject_RichCompareBool(dtype, self->dtype, Py_EQ);
        if (eq < 0) goto done;
        if (!eq) {
            result = 0;
            goto done;
        }
    }
    shp = PyObject_GetAttr(arr, str_shape);
    if (shp == NULL) goto done;
    if (!PyTuple_Check(shp) || PyTuple_GET_SIZE(shp) != self->ndim) {
        result = 0;
        goto done;
    }
    long long size = 1;
    for (Py_ssize_t k = 0; k < self->ndim; k++) {
        long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(shp, k));
        if (d == -1 && PyErr_Occurred()) goto done;
        shape[k] = d;
        if (size && d && size > (long long)0x7fffffffffffffffLL / d) size = 0x7fffffffffffffffLL;
        else size *= d;
    }
    nb = PyObject_GetAttr(arr, str_nbytes);
    if (nb == NULL) goto done;
    *nbytes = PyLong_AsSsize_t(nb);
    if (*nbytes == -1 && PyErr_Occurred()) goto done;
    if (*nbytes > SMALL_BODY || (*nbytes == 0 && size > self->max_empty)) {
        result = 0;
        goto done;
    }
    if (PyObject_GetBuffer(arr, view, PyBUF_C_CONTIGUOUS) == 0 && view->len == *nbytes) {
        result = 1;
        goto done;
    }
    if (view->obj != NULL) PyBuffer_Release(view);
    view->obj = NULL;
    PyErr_Clear(); /* not C-contiguous, or a dtype the buffer protocol refuses */
    *data = PyObject_CallMethodNoArgs(arr, str_tobytes);
    if (*data == NULL) goto done;
    if (!PyBytes_Check(*data) || PyBytes_GET_SIZE(*data) != *nbytes) {
        Py_CLEAR(*data);
        result = 0;
        goto done;
    }
    result = 1;
done:
    Py_XDECREF(dtype);
    Py_XDECREF(shp);
    Py_XDECREF(nb);
    return result;
}

/* encode_small's body, with *headroom* bytes (left unwritten) before the body in the
 * bytes object returned: a DATA frame's prefix (PublishPath). None as encode_small. */
static PyObject *encode_small_into(TemplateObject *self, PyObject *obj, Py_ssize_t limit,
                                   Py_ssize_t headroom) {
    if (limit > SMALL_BODY) limit = SMALL_BODY;
    if ((PyObject *)Py_TYPE(obj) != self->kind) Py_RETURN_NONE;

    PyObject *items[TEMPLATE_MAX_ITEMS];
    int got = items_of(self, obj, items);
    if (got <= 0) {
        if (got < 0) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    PyObject *data = NULL;
    Py_buffer view;
    view.obj = NULL;
    long long shape[MAX_NDIM];
    Py_ssize_t nbytes = 0, shape_n = 0;
    Py_ssize_t count = self->count;
    for (Py_ssize_t i = 0; i < count; i++) {
        if ((PyObject *)Py_TYPE(items[i]) != PyTuple_GET_ITEM(self->types, i))
            goto none;
    }
    if (self->array_at >= 0) {
        int ok = array_of(self, items[self->array_at], shape, &nbytes, &view, &data);
        if (ok < 0) goto done;
        if (ok == 0) goto none;
        shape_n = self->ndim;
        if (nbytes > limit) goto none;
    }

    if (self->names_unpackable) goto none; /* (as packing the name fails there) */

    /* inner: the packed container (array of items, or map of names to items) */
    unsigned char inner_buf[SMALL_BODY];
    Out o = {inner_buf, inner_buf + sizeof inner_buf};
    int ok = self->container <= C_LIST ? pack_len(&o, count, 0x90, 16, 0xdc, 0xdd)
                                       : pack_len(&o, count, 0x80, 16, 0xde, 0xdf);
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        if (self->container >= C_DICT) {
            PyObject *name = PyTuple_GET_ITEM(self->packed_names, i);
            ok = put_raw(&o, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name));
            if (!ok) break;
        }
        int r = pack_item(self, i, items[i], &o, shape_n, shape);
        if (r < 0) goto done;
        ok = r;
    }
    if (!ok) goto none;
    Py_ssize_t inner_len = o.p - inner_buf;

    /* head: the tuple's or dataclass's ext header (+ the dataclass prefix) */
    unsigned char head_buf[16];
    Out h = {head_buf, head_buf + sizeof head_buf};
    Py_ssize_t prefix_len = 0;
    if (self->container == C_TUPLE) {
        pack_ext_header(&h, inner_len, EXT_TUPLE);
    } else if (self->container == C_DATACLASS) {
        prefix_len = PyBytes_GET_SIZE(self->prefix);
        pack_ext_header(&h, inner_len + prefix_len, EXT_DATACLASS);
    }
    Py_ssize_t head_len = h.p - head_buf;
    Py_ssize_t meta_len = head_len + prefix_len + inner_len;
    int nbuf = self->array_at >= 0;
    Py_ssize_t pos = 8 + 8 * nbuf + meta_len;
    Py_ssize_t pad = nbuf ? (-pos & (BUFFER_ALIGNMENT - 1)) : 0;
    Py_ssize_t total = pos + pad + nbytes;
    if (total > limit) goto none;

    result = PyBytes_FromStringAndSize(NULL, headroom + total);
    if (result == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(result) + headroom;
    p[0] = FORMAT_VERSION;
    p[1] = 0;
    p[2] = (unsigned char)nbuf;
    p[3] = 0;
    for (int b = 0; b < 4; b++) p[4 + b] = (unsigned char)((uint64_t)meta_len >> (8 * b));
    p += 8;
    if (nbuf) {
        for (int b = 0; b < 8; b++) p[b] = (unsigned char)((uint64_t)nbytes >> (8 * b));
        p += 8;
    }
    memcpy(p, head_buf, (size_t)head_len);
    p += head_len;
    if (prefix_len) {
        memcpy(p, PyBytes_AS_STRING(self->prefix), (size_t)prefix_len);
        p += prefix_len;
    }
    memcpy(p, inner_buf, (size_t)inner_len);
    p += inner_len;
    if (nbuf) {
        memset(p, 0, (size_t)pad);
        p += pad;
        if (nbytes) memcpy(p, data != NULL ? PyBytes_AS_STRING(data) : view.buf, (size_t)nbytes);
    }
    goto done;
none:
    result = Py_None;
    Py_INCREF(result);
done:
    if (view.obj != NULL) PyBuffer_Release(&view);
    Py_XDECREF(data);
    for (Py_ssize_t i = 0; i < count; i++) Py_DECREF(items[i]);
    return result;
}

static PyObject *Template_encode_small(TemplateObject *self, PyObject *const *args,
                                       Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "encode_small(obj, limit)");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    return encode_small_into(self, args[0], limit, 0);
}

/* The values of dict *obj* in order when its keys are exactly this template's names,
 * each an exact str (no user __eq__ or __hash__ runs), as count new references in
 * items[]. 1: done; 0: not of this shape. */
static int exact_dict_items(TemplateObject *self, PyObject *obj, PyObject **items) {
    Py_ssize_t count = self->count, pos = 0, i = 0;
    PyObject *key, *value;
    if (PyDict_GET_SIZE(obj) != count) return 0;
    while (i < count && PyDict_Next(obj, &pos, &key, &value)) {
        PyObject *name = PyTuple_GET_ITEM(self->names, i);
        if (!PyUnicode_CheckExact(key) || (key != name && PyUnicode_Compare(key, name) != 0))
            break;
        Py_INCREF(value);
        items[i++] = value;
    }
    if (i == count) return 1;
    for (Py_ssize_t k = 0; k < i; k++) Py_DECREF(items[k]);
    return 0;
}

/* check(obj): Codec.validate's fast path. True when obj has this template's shape
 * (container, length, names, exact item types, the array's dtype) and every int is in
 * msgpack's range: then _general._check raises nothing for obj (it checks types, int
 * ranges and dtypes, not str contents, sizes or an array's shape). False means
 * undecided: the general check decides, and raises what there is to raise. Raises
 * only what is not an Exception (a KeyboardInterrupt in a field's getter): an
 * Exception while reading obj (a missing dataclass field) is cleared and gives False,
 * and the general check meets it again. */
static PyObject *Template_check(TemplateObject *self, PyObject *obj) {
    if ((PyObject *)Py_TYPE(obj) != self->kind) Py_RETURN_FALSE;
    PyObject *items[TEMPLATE_MAX_ITEMS];
    int got = self->container == C_DICT ? exact_dict_items(self, obj, items)
                                        : items_of(self, obj, items);
    if (got <= 0) {
        if (got < 0) {
            /* (a KeyboardInterrupt met in a field's getter is not swallowed) */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
            PyErr_Clear();
        }
        Py_RETURN_FALSE;
    }
    Py_ssize_t count = self->count;
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        PyObject *v = items[i];
        if ((PyObject *)Py_TYPE(v) != PyTuple_GET_ITEM(self->types, i)) {
            ok = 0;
            break;
        }
        if (self->item_kinds[i] == I_INT) {
            long long d;
            unsigned long long u;
            int form = msgpack_int(v, &d, &u);
            if (form < 0) PyErr_Clear();
            ok = form > 0;
        } else if (self->item_kinds[i] == I_ARRAY) {
            PyObject *dtype = PyObject_GetAttr(v, str_dtype);
            if (dtype == NULL) {
                PyErr_Clear();
                ok = 0;
            } else {
                if (dtype != self->dtype) {
                    int eq = PyObject_RichCompareBool(dtype, self->dtype, Py_EQ);
                    if (eq < 0) PyErr_Clear();
                    ok = eq > 0;
                }
                Py_DECREF(dtype);
            }
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) Py_DECREF(items[i]);
    return PyBool_FromLong(ok);
}

static PyMethodDef Template_methods[] = {
    {"encode_small", (PyCFunction)(void (*)(void))Template_encode_small, METH_FASTCALL,
     "encode_small(obj, limit) -> bytes | None: the body of obj, exactly as "
     "_Template.encode_small returns it."},
    {"check", (PyCFunction)Template_check, METH_O,
     "check(obj) -> bool: True when obj has this shape and _general._check raises "
     "nothing for it; False: undecided (Codec.validate's fast path)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TemplateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ezflow._core._speedups.Template",
    .tp_basicsize = sizeof(TemplateObject),
    .tp_dealloc = (destructor)Template_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled encode of one message shape (see the module docstring).",
    .tp_methods = Template_methods,
    .tp_new = Template_new,
};

/* ---------------------------------------------------------------- Layout */

enum { OP_NONE = 0, OP_VALUE, OP_BOOL, OP_STR, OP_FROMBUFFER, OP_NDARRAY, OP_NPSCALAR };
enum { K_TUPLE = 0, K_LIST, K_DICT, K_DATACLASS, K_FIELDS };

typedef struct {
    Py_ssize_t offset; /* of the value's bytes in the body */
    Py_ssize_t size;
    char code; /* struct code (big endian): BHIQbhiqfd, or s (size bytes) */
} Value;

typedef struct {
    int op;
    Py_ssize_t value;  /* OP_VALUE, OP_BOOL, OP_STR: which value */
    PyObject *dtype;   /* arrays and numpy scalars */
    PyObject *shape;   /* OP_FROMBUFFER: the count (int); OP_NDARRAY: the shape (tuple) */
    PyObject *offset;  /* arrays and numpy scalars: the offset (int) */
    PyObject *last;    /* OP_STR: the last ASCII str decoded here (a stream repeats its
                        * names and tags: an equal str is handed out again) */
} Item;

typedef struct {
    PyObject_HEAD
    Py_ssize_t size;
    Py_ssize_t check_len;
    unsigned char *mask; /* check_len bytes each */
    unsigned char *fixed;
    Py_ssize_t nvalues;
    Value *values;
    int kind; /* K_* */
    Py_ssize_t nitems;
    Item *items;
    PyObject *keys; /* tuple of str (K_DICT, K_DATACLASS), or None (a dataclass called with
                     * its items as positional arguments; tuples and lists) */
    PyObject *cls;  /* the dataclass, or None */
    Py_ssize_t *slots; /* K_FIELDS: per item, the offset of its __slots__ member in the
                        * instance, or -1 (set with PyObject_GenericSetAttr) */
    PyObject *init, *new_, *setattr; /* K_FIELDS: the class's, as learned (fields_hold) */
    unsigned int version;            /* K_FIELDS: the class's tp_version_tag when they were */
    PyObject *frombuffer;
    PyObject *ndarray;
    PyObject *empty; /* () */
} LayoutObject;

static void Layout_dealloc(LayoutObject *self) {
    if (self->items != NULL) {
        for (Py_ssize_t i = 0; i < self->nitems; i++) {
            Py_XDECREF(self->items[i].dtype);
            Py_XDECREF(self->items[i].shape);
            Py_XDECREF(self->items[i].offset);
            Py_XDECREF(self->items[i].last);
        }
    }
    PyMem_Free(self->items);
    PyMem_Free(self->slots);
    Py_XDECREF(self->init);
    Py_XDECREF(self->new_);
    Py_XDECREF(self->setattr);
    PyMem_Free(self->values);
    PyMem_Free(self->mask);
    Py_XDECREF(self->keys);
    Py_XDECREF(self->cls);
    Py_XDECREF(self->frombuffer);
    Py_XDECREF(self->ndarray);
    Py_XDECREF(self->empty);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t code_size(char code) {
    switch (code) {
    case 'B': case 'b': return 1;
    case 'H': case 'h': return 2;
    case 'I': case 'i': case 'f': return 4;
    case 'Q': case 'q': case 'd': return 8;
    }
    return -1;
}

static PyObject *Layout_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"size", "mask", "fixed", "codes", "spec", "frombuffer", "ndarray",
                             NULL};
    Py_ssize_t size;
    PyObject *mask, *fixed, *codes, *spec, *frombuffer, *ndarray;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO!O!O!O!OO", kwlist, &size, &PyBytes_Type,
                                     &mask, &PyBytes_Type, &fixed, &PyTuple_Type, &codes,
                                     &PyTuple_Type, &spec, &frombuffer, &ndarray))
        return NULL;
    Py_ssize_t check_len = PyBytes_GET_SIZE(mask);
    if (PyBytes_GET_SIZE(fixed) != check_len || size < 0) {
        PyErr_SetString(PyExc_ValueError, "mask and fixed differ in length");
        return NULL;
    }
    int kind;
    PyObject *items, *keys, *cls;
    if (!PyArg_ParseTuple(spec, "iO!OO", &kind, &PyTuple_Type, &items, &keys, &cls)) return NULL;
    if (kind < K_TUPLE || kind > K_FIELDS) {
        PyErr_Format(PyExc_ValueError, "unknown message kind %d", kind);
        return NULL;
    }
    Py_ssize_t nitems = PyTuple_GET_SIZE(items);
    /* (a dataclass without keys is called with its items as positional arguments) */
    if (kind >= K_DICT && !(kind == K_DATACLASS && keys == Py_None) &&
        (!PyTuple_Check(keys) || PyTuple_GET_SIZE(keys) != nitems)) {
        PyErr_SetString(PyExc_ValueError, "keys must be a tuple of one str per item");
        return NULL;
    }
    LayoutObject *self = (LayoutObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->size = size;
    self->check_len = check_len;
    self->kind = kind;
    self->nitems = nitems;
    self->nvalues = PyTuple_GET_SIZE(codes);
    self->mask = PyMem_Malloc((size_t)(2 * check_len + 1));
    self->values = PyMem_Calloc((size_t)(self->nvalues + 1), sizeof(Value));
    self->items = PyMem_Calloc((size_t)(nitems + 1), sizeof(Item));
    if (self->mask == NULL || self->values == NULL || self->items == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->fixed = self->mask + check_len;
    if (check_len) {
        memcpy(self->mask, PyBytes_AS_STRING(mask), (size_t)check_len);
        memcpy(self->fixed, PyBytes_AS_STRING(fixed), (size_t)check_len);
    }
    for (Py_ssize_t k = 0; k < self->nvalues; k++) {
        Py_ssize_t offset, vsize;
        const char *code;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(codes, k), "nsn", &offset, &code, &vsize))
            goto fail;
        char c = code[strlen(code) - 1]; /* "B", "d", "12s" */
        if (offset < 0 || vsize < 0 || (c != 's' && code_size(c) != vsize) ||
            (c != 's' && strlen(code) != 1)) {
            PyErr_Format(PyExc_ValueError, "bad value code %s", code);
            goto fail;
        }
        self->values[k].offset = offset;
        self->values[k].size = vsize;
        self->values[k].code = c;
    }
    for (Py_ssize_t i = 0; i < nitems; i++) {
        int op;
        PyObject *a, *b, *c;
        Item *item = &self->items[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(items, i), "iOOO", &op, &a, &b, &c)) goto fail;
        item->op = op;
        if (op == OP_VALUE || op == OP_BOOL || op == OP_STR) {
            item->value = PyLong_AsSsize_t(a);
            if (item->value == -1 && PyErr_Occurred()) goto fail;
            if (item->value < 0 || item->value >= self->nvalues) {
                PyErr_Format(PyExc_ValueError, "item %zd reads no value", i);
                goto fail;
            }
        } else if (op == OP_FROMBUFFER || op == OP_NDARRAY || op == OP_NPSCALAR) {
            Py_INCREF(a);
            item->dtype = a;
            Py_INCREF(b);
            item->shape = b;
            Py_INCREF(c);
            item->offset = c;
        } else if (op != OP_NONE) {
            PyErr_Format(PyExc_ValueError, "unknown item op %d", op);
            goto fail;
        }
    }
    Py_INCREF(keys);
    self->keys = keys;
    Py_INCREF(cls);
    self->cls = cls;
    if (kind == K_FIELDS) {
        /* object.__new__(cls), then object.__setattr__ of each field: for a __slots__
         * member (what a member descriptor's __set__ does) the store itself. */
        if (!PyType_Check(cls)) {
            PyErr_SetString(PyExc_TypeError, "a fields layout needs a class");
            goto fail;
        }
        PyTypeObject *tp = (PyTypeObject *)cls;
        self->init = Py_XNewRef(_PyType_Lookup(tp, str_init));
        self->new_ = Py_XNewRef(_PyType_Lookup(tp, str_new));
        self->setattr = Py_XNewRef(_PyType_Lookup(tp, str_setattr));
        self->version = tp->tp_version_tag;
        self->slots = PyMem_Calloc((size_t)(nitems + 1), sizeof(Py_ssize_t));
        if (self->slots == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < nitems; i++) {
            PyObject *key = PyTuple_GET_ITEM(keys, i);
            if (!PyUnicode_Check(key)) {
                PyErr_SetString(PyExc_TypeError, "field names must be str");
                goto fail;
            }
            PyObject *descr = _PyType_Lookup((PyTypeObject *)cls, key); /* (borrowed) */
            self->slots[i] = -1;
            if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
                PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
                if (member->type == T_OBJECT_EX && !(member->flags & READONLY))
                    self->slots[i] = member->offset;
            }
        }
    }
    Py_INCREF(frombuffer);
    self->frombuffer = frombuffer;
    Py_INCREF(ndarray);
    self->ndarray = ndarray;
    self->empty = PyTuple_New(0);
    if (self->empty == NULL) goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static inline uint64_t read_be(const unsigned char *p, Py_ssize_t n) {
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* Value k of the body, as struct.unpack (big endian) gives it. */
static PyObject *value_of(const Value *v, const unsigned char *buf) {
    const unsigned char *p = buf + v->offset;
    switch (v->code) {
    case 'B': case 'H': case 'I': case 'Q':
        return PyLong_FromUnsignedLongLong(read_be(p, v->size));
    case 'b': return PyLong_FromLong((int8_t)p[0]);
    case 'h': return PyLong_FromLong((int16_t)(uint16_t)read_be(p, 2));
    case 'i': return PyLong_FromLong((long)(int32_t)(uint32_t)read_be(p, 4));
    case 'q': return PyLong_FromLongLong((long long)read_be(p, 8));
    case 'f': {
#if PY_VERSION_HEX >= 0x030B0000
        double d = PyFloat_Unpack4((const char *)p, 0);
#else
        double d = _PyFloat_Unpack4(p, 0);
#endif
        if (d == -1.0 && PyErr_Occurred()) return NULL;
        return PyFloat_FromDouble(d);
    }
    case 'd': {
#if PY_VERSION_HEX >= 0x030B0000
        double d = PyFloat_Unpack8((const char *)p, 0);
#else
        double d = _PyFloat_Unpack8(p, 0);
#endif
        if (d == -1.0 && PyErr_Occurred()) return NULL;
        return PyFloat_FromDouble(d);
    }
    default: /* 's' */
        return PyBytes_FromStringAndSize((const char *)p, v->size);
    }
}

/* Untrack *tuple* when none of its items is tracked by the collector (ints, floats, str,
 * arrays...): such a tuple cannot be part of a reference cycle, and the collector would
 * untrack it at its first pass anyway (_PyTuple_MaybeUntrack). Untracked at once, it never
 * sits in the young generation a collection walks, nor gets promoted to an older one:
 * a subscriber's backlog of decoded messages costs the collector nothing. A tuple holding
 * anything tracked (a list, a dict, a tracked tuple, an object) stays tracked. */
static void untrack_if_atomic(PyObject *tuple) {
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(tuple); i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item)) return;
    }
    PyObject_GC_UnTrack(tuple);
}

static PyObject *build_item(LayoutObject *self, Item *item, PyObject *body,
                            const unsigned char *buf) {
    switch (item->op) {
    case OP_NONE:
        Py_RETURN_NONE;
    case OP_VALUE:
        return value_of(&self->values[item->value], buf);
    case OP_BOOL:
        return PyBool_FromLong(buf[self->values[item->value].offset] == 0xc3);
    case OP_STR: {
        const Value *v = &self->values[item->value];
        const char *data = (const char *)buf + v->offset;
        PyObject *last = item->last;
        if (last != NULL && PyUnicode_GET_LENGTH(last) == v->size &&
            memcmp(PyUnicode_DATA(last), data, (size_t)v->size) == 0)
            return Py_NewRef(last); /* (an ASCII str: its bytes are its UTF-8) */
        PyObject *str = PyUnicode_DecodeUTF8(data, v->size, NULL);
        if (str != NULL && PyUnicode_IS_ASCII(str) && PyUnicode_IS_COMPACT(str))
            Py_XSETREF(item->last, Py_NewRef(str));
        return str;
    }
    case OP_FROMBUFFER: {
        PyObject *args[4] = {body, item->dtype, item->shape, item->offset};
        return PyObject_Vectorcall(self->frombuffer, args, 4, NULL);
    }
    case OP_NDARRAY: {
        PyObject *args[4] = {item->shape, item->dtype, body, item->offset};
        return PyObject_Vectorcall(self->ndarray, args, 4, NULL);
    }
    default: { /* OP_NPSCALAR */
        PyObject *args[4] = {self->empty, item->dtype, body, item->offset};
        PyObject *arr = PyObject_Vectorcall(self->ndarray, args, 4, NULL);
        if (arr == NULL) return NULL;
        PyObject *scalar = PyObject_GetItem(arr, self->empty);
        Py_DECREF(arr);
        return scalar;
    }
    }
}

/* Whether the class of a fields layout still is what the layout was learned from: its
 * __init__, __new__ and __setattr__ the same objects (a __post_init__ added later is
 * not called by a generated __init__ either). One compare while the class is unchanged
 * (its version tag); after a change, the lookups. */
static int fields_hold(LayoutObject *self) {
    PyTypeObject *tp = (PyTypeObject *)self->cls;
    if ((tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag == self->version)
        return 1;
    if (_PyType_Lookup(tp, str_init) != self->init || _PyType_Lookup(tp, str_new) != self->new_ ||
        _PyType_Lookup(tp, str_setattr) != self->setattr)
        return 0;
    if (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) self->version = tp->tp_version_tag;
    return 1;
}

/* decode(body): the message in body, or None (see _Layout.decode_py). */
static PyObject *Layout_decode(LayoutObject *self, PyObject *body) {
    Py_buffer view;
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len;
    PyObject *result = NULL, *items = NULL;
    /* int.from_bytes(body[:check_len], "little") & mask != fixed: eight bytes at a
     * time where the body has them, then byte by byte (a byte past the body is 0) */
    Py_ssize_t words = (self->check_len < n ? self->check_len : n) & ~(Py_ssize_t)7;
    for (Py_ssize_t i = 0; i < words; i += 8) {
        uint64_t b, m, f;
        memcpy(&b, buf + i, 8);
        memcpy(&m, self->mask + i, 8);
        memcpy(&f, self->fixed + i, 8);
        if ((b & m) != f) goto none;
    }
    for (Py_ssize_t i = words; i < self->check_len; i++) {
        unsigned char b = i < n ? buf[i] : 0;
        if ((b & self->mask[i]) != self->fixed[i]) goto none;
    }
    for (Py_ssize_t k = 0; k < self->nvalues; k++) { /* (struct.error: too short) */
        if (self->values[k].offset + self->values[k].size > n) goto none;
    }
    Py_ssize_t nitems = self->nitems;
    if (self->kind == K_FIELDS && fields_hold(self)) {
        /* (a dataclass whose generated __init__ only stores its fields: see
         * _layouts._builds_by_fields; a class changed since is called with keywords,
         * as the general decoder calls it) */
        PyObject *message = PyBaseObject_Type.tp_new((PyTypeObject *)self->cls, self->empty, NULL);
        if (message == NULL) goto failed;
        for (Py_ssize_t i = 0; i < nitems; i++) {
            PyObject *item = build_item(self, &self->items[i], body, buf);
            if (item == NULL) {
                Py_DECREF(message);
                goto failed;
            }
            Py_ssize_t slot = self->slots[i];
            if (slot >= 0) {
                PyObject **at = (PyObject **)((char *)message + slot);
                Py_XSETREF(*at, item);
            } else {
                int set = PyObject_GenericSetAttr(message, PyTuple_GET_ITEM(self->keys, i), item);
                Py_DECREF(item);
                if (set < 0) {
                    Py_DECREF(message);
                    goto failed;
                }
            }
        }
        result = message;
        goto done;
    }
    items = self->kind == K_LIST ? PyList_New(nitems) : PyTuple_New(nitems);
    if (items == NULL) goto done;
    for (Py_ssize_t i = 0; i < nitems; i++) {
        PyObject *item = build_item(self, &self->items[i], body, buf);
        if (item == NULL) goto failed;
        if (self->kind == K_LIST) PyList_SET_ITEM(items, i, item);
        else PyTuple_SET_ITEM(items, i, item);
    }
    if (self->kind <= K_LIST) {
        if (self->kind == K_TUPLE) untrack_if_atomic(items);
        result = items;
        items = NULL;
        goto done;
    }
    if (self->keys == Py_None) { /* a dataclass whose __init__ takes its fields in order */
        result = PyObject_Vectorcall(self->cls, &PyTuple_GET_ITEM(items, 0), nitems, NULL);
        if (result == NULL) goto failed;
        goto done;
    }
    PyObject *fields = PyDict_New();
    if (fields == NULL) goto done;
    for (Py_ssize_t i = 0; i < nitems; i++) {
        if (PyDict_SetItem(fields, PyTuple_GET_ITEM(self->keys, i), PyTuple_GET_ITEM(items, i)) <
            0) {
            Py_DECREF(fields);
            goto failed;
        }
    }
    if (self->kind == K_DICT) {
        result = fields;
        goto done;
    }
    result = PyObject_Call(self->cls, self->empty, fields);
    Py_DECREF(fields);
    if (result == NULL) goto failed;
    goto done;
failed:
    /* (a str that is not UTF-8, a constructor that raises: the general decoder says
     * what is wrong) - as `except Exception: return None` */
    if (!PyErr_ExceptionMatches(PyExc_Exception)) goto done;
    PyErr_Clear();
none:
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(items);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef Layout_methods[] = {
    {"decode", (PyCFunction)Layout_decode, METH_O,
     "decode(body) -> object | None: the message in body, exactly as "
     "_Layout.decode_py returns it."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ezflow._core._speedups.Layout",
    .tp_basicsize = sizeof(LayoutObject),
    .tp_dealloc = (destructor)Layout_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled decode of bodies of one layout (see the module docstring).",
    .tp_methods = Layout_methods,
    .tp_new = Layout_new,
};

/* ---------------------------------------------------------------- run_frames */

/* buckets[k] += 1 (a list of ints, as Histogram keeps them); -1 with an error set */
static int bump_bucket(PyObject *buckets, Py_ssize_t k) {
    if (k < 0 || k >= PyList_GET_SIZE(buckets)) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return -1;
    }
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL) return -1;
    PyObject *sum = PyNumber_Add(PyList_GET_ITEM(buckets, k), one);
    Py_DECREF(one);
    if (sum == NULL) return -1;
    PyList_SetItem(buckets, k, sum); /* (steals sum) */
    return 0;
}

/* PyLong_AsUnsignedLongLong / PyLong_AsLongLong, with exact ints of up to 60 bits read
 * directly (small_ll): 3.11's converts every unsigned and every multi-digit int through a
 * byte array, several times this for a frame's seq, drops and send time and the sampled
 * clock reading. */
static inline unsigned long long as_ull(PyObject *v) {
    long long x;
    if (PyLong_CheckExact(v) && small_ll(v, &x) && x >= 0) return (unsigned long long)x;
    return PyLong_AsUnsignedLongLong(v);
}

static inline long long as_ll(PyObject *v) {
    long long x;
    if (PyLong_CheckExact(v) && small_ll(v, &x)) return x;
    return PyLong_AsLongLong(v);
}

/* clock() as a long long (time.time_ns); -1 with an error set */
static int clock_ns(PyObject *clock, long long *out) {
    PyObject *t = PyObject_CallNoArgs(clock);
    if (t == NULL) return -1;
    *out = as_ll(t);
    Py_DECREF(t);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* run_frames(frames, index, size, decode, upstream, lossless, pending_append, appends,
 * buckets, now_ns, mask, progress, clock, decode_buckets) -> (index reached, latency
 * total, decode total): the twin of ezflow._core._channel_run.run_frames_py (the loop of
 * Channel.deliver_run). On an exception progress[:] = [index reached, latency total so
 * far, decode total so far]. */
static PyObject *run_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 14 || !PyList_Check(args[0]) || !PyList_Check(args[7]) ||
        !PyList_Check(args[8]) || !PyList_Check(args[11]) || !PyList_Check(args[13])) {
        PyErr_SetString(PyExc_TypeError,
                         "run_frames(frames: list, index, size, decode, upstream, lossless, "
                         "pending_append, appends: list, buckets: list, now_ns, mask, "
                         "progress: list, clock, decode_buckets: list)");
        return NULL;
    }
    PyObject *frames = args[0], *size_obj = args[2], *decode = args[3], *lossless = args[5];
    PyObject *pending_append = args[6], *appends = args[7], *buckets = args[8];
    PyObject *progress = args[11], *clock = args[12], *decode_buckets = args[13];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "index must not be negative");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(size_obj);
    if (size == -1 && PyErr_Occurred()) return NULL;
    unsigned long long upstream = PyLong_AsUnsignedLongLong(args[4]);
    if (upstream == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int is_lossless = PyObject_IsTrue(lossless);
    if (is_lossless < 0) return NULL;
    long long now_ns = PyLong_AsLongLong(args[9]);
    if (now_ns == -1 && PyErr_Occurred()) return NULL;
    unsigned long long mask = PyLong_AsUnsignedLongLong(args[10]);
    if (mask == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_ssize_t nappends = PyList_GET_SIZE(appends);
    for (Py_ssize_t a = 0; a < nappends; a++) {
        PyObject *pair = PyList_GET_ITEM(appends, a);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "appends must be (attachment, append) pairs");
            return NULL;
        }
    }
    long long latency_total = 0, decode_total = 0;
    /* (frames and appends are the read loop's own lists, out of reach of what decode
     * may run: their items are borrowed) */
    while (i < PyList_GET_SIZE(frames)) {
        PyObject *frame = PyList_GET_ITEM(frames, i);
        if (!PyTuple_Check(frame) || PyTuple_GET_SIZE(frame) != 5) {
            PyErr_SetString(PyExc_TypeError, "a frame must be a 5-tuple");
            goto error;
        }
        PyObject *seq = PyTuple_GET_ITEM(frame, 1), *body = PyTuple_GET_ITEM(frame, 2);
        unsigned long long seqv = as_ull(seq);
        if (seqv == (unsigned long long)-1 && PyErr_Occurred()) goto error;
        unsigned long long drops = as_ull(PyTuple_GET_ITEM(frame, 3));
        if (drops == (unsigned long long)-1 && PyErr_Occurred()) goto error;
        if (drops > upstream) break;
        Py_ssize_t length = PyObject_Length(body);
        if (length < 0) goto error;
        if (length != size) break;
        long long started = 0; /* (a timed one: one in mask + 1) */
        if (!(seqv & mask) && clock_ns(clock, &started) < 0) goto error;
        PyObject *message = PyObject_CallOneArg(decode, body);
        if (message == NULL) goto error;
        if (message == Py_None) {
            Py_DECREF(message);
            break;
        }
        if (!(seqv & mask)) {
            long long stopped;
            if (clock_ns(clock, &stopped) < 0) goto failed;
            long long decode_ns = stopped - started;
            if (decode_ns > 0) { /* (not across a clock step) */
                if (bump_bucket(decode_buckets,
                                64 - __builtin_clzll((unsigned long long)decode_ns)) < 0)
                    goto failed;
                decode_total += decode_ns;
            }
        }
        if (is_lossless) {
            PyObject *entry = PyList_New(3);
            if (entry == NULL) goto failed;
            Py_INCREF(seq);
            PyList_SET_ITEM(entry, 0, seq);
            Py_INCREF(lossless);
            PyList_SET_ITEM(entry, 1, lossless);
            Py_INCREF(size_obj);
            PyList_SET_ITEM(entry, 2, size_obj);
            /* Ints only, now and when its count is written: never in a cycle, so never
             * walked by the collector (a backlog of pending entries is one per message). */
            PyObject_GC_UnTrack(entry);
            PyObject *r = PyObject_CallOneArg(pending_append, entry);
            Py_DECREF(entry);
            if (r == NULL) goto failed;
            Py_DECREF(r);
        }
        for (Py_ssize_t a = 0; a < nappends; a++) {
            PyObject *pair = PyList_GET_ITEM(appends, a);
            PyObject *item = PyTuple_Pack(3, PyTuple_GET_ITEM(pair, 0), seq, message);
            if (item == NULL) goto failed;
            PyObject *r = PyObject_CallOneArg(PyTuple_GET_ITEM(pair, 1), item);
            Py_DECREF(item);
            if (r == NULL) goto failed;
            Py_DECREF(r);
        }
        Py_DECREF(message);
        long long sent_ns = as_ll(PyTuple_GET_ITEM(frame, 4));
        if (sent_ns == -1 && PyErr_Occurred()) goto error;
        if (sent_ns) {
            long long latency = now_ns - sent_ns;
            if (latency > 0) {
                if (bump_bucket(buckets, 64 - __builtin_clzll((unsigned long long)latency)) < 0)
                    goto error;
                latency_total += latency;
            } else if (bump_bucket(buckets, 0) < 0) { /* the clocks of two hosts disagree */
                goto error;
            }
        }
        i++;
        continue;
    failed:
        Py_DECREF(message);
        goto error;
    }
    return Py_BuildValue("(nLL)", i, latency_total, decode_total);
error:;
    /* progress[:] = [i, latency_total, decode_total], the exception kept */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *reached = Py_BuildValue("[nLL]", i, latency_total, decode_total);
    if (reached != NULL) {
        if (PyList_SetSlice(progress, 0, PyList_GET_SIZE(progress), reached) < 0) PyErr_Clear();
        Py_DECREF(reached);
    } else {
        PyErr_Clear();
    }
    PyErr_Restore(type, value, traceback);
    return NULL;
}

/* ---------------------------------------------------------------- small_frames */

#define DATA_KIND 1
#define DATA_PREFIX_SIZE 36 /* u32 length | u8 kind | u8 flags | 6 pad | u64 seq | i64 sent | u64 drops */
#define DATA_HEADER_SIZE 32

static inline uint64_t read_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* small_frames(data, start, end, max_frame_size, slice_below): the twin of
 * ezflow._transports._stream_channel._small_frames_py. */
static PyObject *small_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                         "small_frames(data, start, end, max_frame_size, slice_below)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t max_frame_size = PyLong_AsSsize_t(args[3]);
    if (max_frame_size == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t slice_below = PyLong_AsSsize_t(args[4]);
    if (slice_below == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *frames = NULL;
    if (start < 0 || start > end || end > view.len) {
        PyErr_Format(PyExc_ValueError, "frames at %zd..%zd of a buffer of %zd bytes", start, end,
                     view.len);
        goto done;
    }
    frames = PyList_New(0);
    if (frames == NULL) goto done;
    const unsigned char *buf = view.buf;
    while (end - start >= DATA_PREFIX_SIZE) {
        const unsigned char *p = buf + start;
        uint64_t size = read_le(p, 4);
        Py_ssize_t frame_end = start + 4 + (Py_ssize_t)size;
        if (p[4] != DATA_KIND || frame_end > end || size > (uint64_t)slice_below ||
            size > (uint64_t)max_frame_size || size < DATA_HEADER_SIZE)
            break;
        PyObject *frame = PyTuple_New(5);
        if (frame == NULL) {
            Py_CLEAR(frames);
            goto done;
        }
        PyTuple_SET_ITEM(frame, 0, PyLong_FromSsize_t(frame_end));
        PyTuple_SET_ITEM(frame, 1, PyLong_FromUnsignedLongLong(read_le(p + 12, 8)));
        PyTuple_SET_ITEM(frame, 2,
                         PyBytes_FromStringAndSize((const char *)p + DATA_PREFIX_SIZE,
                                                   frame_end - start - DATA_PREFIX_SIZE));
        PyTuple_SET_ITEM(frame, 3, PyLong_FromUnsignedLongLong(read_le(p + 28, 8)));
        PyTuple_SET_ITEM(frame, 4, PyLong_FromLongLong((long long)read_le(p + 20, 8)));
        int failed = 0;
        for (int i = 0; i < 5; i++) failed |= PyTuple_GET_ITEM(frame, i) == NULL;
        if (failed || PyList_Append(frames, frame) < 0) {
            Py_DECREF(frame);
            Py_CLEAR(frames);
            goto done;
        }
        Py_DECREF(frame);
        start = frame_end;
    }
done:
    PyBuffer_Release(&view);
    return frames;
}

/* ---------------------------------------------------------------- PublishPath */

/* PublishPath(outlet_type, link_type, stats_type, codec_type, template_type, tracing,
 *             hooks, yield_after, yield_bytes, paced_gap_ns, flush_messages,
 *             flush_bytes, data_kind, header_size)
 *   Its publish(outlet, message) is the compiled twin of
 *   ezflow._transports._stream_publish.publish_small_py: the common path of a small
 *   publish in one call (True), or nothing done (False). The objects' state stays where
 *   the Python code keeps it, in the __slots__ of Outlet, Link/StreamLink, Codec,
 *   _Template, PublisherStats and TraceState: read and written here at the offsets of
 *   their member descriptors, found once by name (the constructor checks that each is
 *   an object slot). Every value is checked before anything changes (an exact int, a
 *   bool, a list); anything else is the general path's business (False). A paced
 *   message on one link (publish_paced) is written through the link's write half and
 *   handed off by Outlet._hand_off: the three Python calls left on that path. */

typedef struct {
    PyObject_HEAD
    PyObject *outlet_type, *link_type, *stats_type, *codec_type, *template_type;
    PyObject *tracing, *hooks;
    Py_ssize_t o_closed, o_unyielded, o_unyielded_bytes, o_fast_limit, o_links, o_codec,
        o_max_count, o_max_bytes, o_handoff, o_sent_ns, o_seq, o_stats;
    Py_ssize_t c_template, c_limit, t_kind, t_encode, tr_active;
    Py_ssize_t l_stalled, l_sent_count, l_released_count, l_sent_bytes, l_released_bytes,
        l_drops, l_inline, l_queued, l_qmessages, l_qbytes, l_flush, l_written, l_connection;
    Py_ssize_t s_messages, s_encodes, s_bytes, s_sends;
    long long yield_after, yield_bytes, paced_gap, flush_messages, flush_bytes;
    int data_kind;
    Py_ssize_t header_size;
    /* the paced handoff done here (see handoff_here), given the outlet module's globals
     * and the functions Outlet._hand_off runs there; else it is called */
    PyObject *ho_globals, *ho_method, *ho_switches, *ho_yield, *ho_clock;
    Py_ssize_t o_slept;
    long long handoffs, handoff_yields; /* (done here: counted, for the tests) */
    /* the local publish (publish_local): an outlet whose one link is of local_link_type,
     * delivered through local_deliver (DeliverPath.deliver); NULL: no such branch */
    PyObject *local_link_type, *local_deliver;
    Py_ssize_t ll_channel, ll_needs_encoding, c_checked, o_small_limit;
    long long local_publishes; /* (done here: counted, for the tests) */
    /* the local relay (PublishPath.relay): bodies of fewer bytes than this count their
     * size toward the outlet's yield (_outlet_objects.yield_share); larger ones decline */
    long long relay_share_below;
    long long local_relays; /* (done here: counted, for the tests) */
    long long stream_relays; /* (PublishPath.relay_stream: counted, for the tests) */
} PublishPathObject;

static PyObject *str_flush, *str_out_of_line_above, *str_out, *str_is_closing, *str_write,
    *str_hand_off, *str_g_switches, *str_g_yield, *str_g_clock, *str_g_gap, *str_body,
    *str_deliver, *str_encoded;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* The offset of the object slot *name* of *type* (a __slots__ member), or -1 (error). */
static Py_ssize_t slot_offset(PyObject *type, const char *name) {
    if (!PyType_Check(type)) {
        PyErr_Format(PyExc_TypeError, "PublishPath: %R is not a type", type);
        return -1;
    }
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL) return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == EZ_T_OBJECT_EX && !(m->flags & EZ_READONLY) &&
            PyType_IsSubtype((PyTypeObject *)type, PyDescr_TYPE(d)))
            off = m->offset;
    }
    Py_DECREF(d);
    if (off < 0)
        PyErr_Format(PyExc_TypeError, "PublishPath: %R.%s is not an object slot", type, name);
    return off;
}

/* One object slot a compiled path reads: where its offset goes, the type, its name. */
typedef struct {
    Py_ssize_t *off;
    PyObject *type;
    const char *name;
} SlotSpec;

/* Fill in the offset of each of *n* slots; -1 (an error set) when one is not an object
 * slot of its type. */
static int fill_slots(const SlotSpec *slots, size_t n) {
    for (size_t i = 0; i < n; i++) {
        *slots[i].off = slot_offset(slots[i].type, slots[i].name);
        if (*slots[i].off < 0) return -1;
    }
    return 0;
}

static int exact_ll(PyObject *v, long long *out) {
    if (v == NULL || !PyLong_CheckExact(v)) return 0;
    if (small_ll(v, out)) return 1;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* the int slot at *off* of *obj*, or 0 (not an exact int in range) */
#define GET_LL(obj, off, var) exact_ll(SLOT(obj, off), &(var))

/* Store *v* in the int slot at *off* of *obj*.
 *
 * On 3.11 (30-bit digits) an int in the slot that nothing else refers to (one reference:
 * the slot's), with as many digits as *v* and *v* above the cached small ints, is
 * written over in place: no other code holds it, so no other code can see it change,
 * and the message path's dozen counter updates cost no allocation and free each (about
 * 1,400 instructions a message on a publisher). Anything else - a shared int, another
 * size, a small value, 3.12+'s layout - gets a new int as before. */
static int set_ll(PyObject *obj, Py_ssize_t off, long long v) {
    PyObject **p = &SLOT(obj, off);
    PyObject *old = *p;
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    if (v > 256 && old != NULL && Py_REFCNT(old) == 1 && PyLong_CheckExact(old)) {
        unsigned long long u = (unsigned long long)v;
        Py_ssize_t size = (u >> 30) == 0 ? 1 : (u >> 60) == 0 ? 2 : 3;
        if (Py_SIZE(old) == size) {
            digit *d = ((PyLongObject *)old)->ob_digit;
            d[0] = (digit)(u & PyLong_MASK);
            if (size > 1) d[1] = (digit)((u >> 30) & PyLong_MASK);
            if (size > 2) d[2] = (digit)(u >> 60);
            return 0;
        }
    }
#endif
    PyObject *n = PyLong_FromLongLong(v);
    if (n == NULL) return -1;
    *p = n;
    Py_XDECREF(old);
    return 0;
}

static long long wall_ns(void) {
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    if (PyTime_Time(&t) < 0) {
        PyErr_Clear();
        return 0;
    }
    return (long long)t;
#else
    return (long long)_PyTime_GetSystemClock();
#endif
}

static void PublishPath_dealloc(PublishPathObject *self) {
    Py_XDECREF(self->outlet_type);
    Py_XDECREF(self->link_type);
    Py_XDECREF(self->stats_type);
    Py_XDECREF(self->codec_type);
    Py_XDECREF(self->template_type);
    Py_XDECREF(self->tracing);
    Py_XDECREF(self->hooks);
    Py_XDECREF(self->ho_globals);
    Py_XDECREF(self->ho_method);
    Py_XDECREF(self->ho_switches);
    Py_XDECREF(self->ho_yield);
    Py_XDECREF(self->ho_clock);
    Py_XDECREF(self->local_link_type);
    Py_XDECREF(self->local_deliver);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *PublishPath_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *ot, *lt, *st, *ct, *tt, *tracing, *hooks;
    PyObject *hg = NULL, *hm = NULL, *hsw = NULL, *hy = NULL, *hc = NULL;
    PyObject *llt = NULL, *ld = NULL;
    long long ya, yb, gap, fm, fb;
    int kind;
    Py_ssize_t hs;
    static char *kwlist[] = {"outlet_type", "link_type", "stats_type", "codec_type",
                             "template_type", "tracing", "hooks", "yield_after",
                             "yield_bytes", "paced_gap_ns", "flush_messages", "flush_bytes",
                             "data_kind", "header_size", "handoff_globals", "hand_off",
                             "switches", "sched_yield", "clock", "local_link_type",
                             "local_deliver", "relay_share_below", NULL};
    long long rsb = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOLLLLLin|OOOOOOOL:PublishPath", kwlist,
                                     &ot, &lt, &st, &ct, &tt, &tracing, &hooks, &ya, &yb, &gap,
                                     &fm, &fb, &kind, &hs, &hg, &hm, &hsw, &hy, &hc, &llt, &ld,
                                     &rsb))
        return NULL;
    if (llt == Py_None) llt = NULL;
    if (ld == Py_None) ld = NULL;
    if ((llt == NULL) != (ld == NULL) || (ld != NULL && !PyCallable_Check(ld))) {
        PyErr_SetString(PyExc_TypeError,
                        "PublishPath: local_link_type and local_deliver (a callable) go together");
        return NULL;
    }
    if (hg == Py_None) hg = NULL;
    if (hg != NULL && !PyDict_Check(hg)) {
        PyErr_SetString(PyExc_TypeError, "PublishPath: handoff_globals must be a dict");
        return NULL;
    }
    if (!PyList_CheckExact(hooks)) {
        PyErr_SetString(PyExc_TypeError, "PublishPath: hooks must be a list");
        return NULL;
    }
    PublishPathObject *self = (PublishPathObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(ot);
    self->outlet_type = ot;
    Py_INCREF(lt);
    self->link_type = lt;
    Py_INCREF(st);
    self->stats_type = st;
    Py_INCREF(ct);
    self->codec_type = ct;
    Py_INCREF(tt);
    self->template_type = tt;
    Py_INCREF(tracing);
    self->tracing = tracing;
    Py_INCREF(hooks);
    self->hooks = hooks;
    self->yield_after = ya;
    self->yield_bytes = yb;
    self->paced_gap = gap;
    self->flush_messages = fm;
    self->flush_bytes = fb;
    self->data_kind = kind;
    self->header_size = hs;
    self->relay_share_below = rsb;
    if (hg != NULL && hm != NULL && hsw != NULL && hy != NULL && hc != NULL) {
        Py_INCREF(hg);
        self->ho_globals = hg;
        Py_INCREF(hm);
        self->ho_method = hm;
        Py_INCREF(hsw);
        self->ho_switches = hsw;
        Py_INCREF(hy);
        self->ho_yield = hy;
        Py_INCREF(hc);
        self->ho_clock = hc;
    }
    PyObject *trt = (PyObject *)Py_TYPE(tracing);
    SlotSpec slots[] = {
        {&self->o_closed, ot, "_closed"},
        {&self->o_unyielded, ot, "_unyielded"},
        {&self->o_unyielded_bytes, ot, "_unyielded_bytes"},
        {&self->o_fast_limit, ot, "_fast_limit"},
        {&self->o_links, ot, "_links"},
        {&self->o_codec, ot, "codec"},
        {&self->o_max_count, ot, "max_in_flight"},
        {&self->o_max_bytes, ot, "max_in_flight_bytes"},
        {&self->o_handoff, ot, "_handoff"},
        {&self->o_sent_ns, ot, "_sent_ns"},
        {&self->o_seq, ot, "_seq"},
        {&self->o_stats, ot, "stats"},
        {&self->o_slept, ot, "_slept"},
        {&self->c_template, ct, "_last_template"},
        {&self->c_limit, ct, "_limit"},
        {&self->t_kind, tt, "kind"},
        {&self->t_encode, tt, "encode_small"},
        {&self->tr_active, trt, "active"},
        {&self->l_stalled, lt, "stalled"},
        {&self->l_sent_count, lt, "sent_count"},
        {&self->l_released_count, lt, "released_count"},
        {&self->l_sent_bytes, lt, "sent_bytes"},
        {&self->l_released_bytes, lt, "released_bytes"},
        {&self->l_drops, lt, "drops"},
        {&self->l_inline, lt, "inline_sends"},
        {&self->l_queued, lt, "_queued"},
        {&self->l_qmessages, lt, "_queued_messages"},
        {&self->l_qbytes, lt, "_queued_bytes"},
        {&self->l_flush, lt, "_flush_scheduled"},
        {&self->l_written, lt, "_written_ns"},
        {&self->l_connection, lt, "connection"},
        {&self->s_messages, st, "messages"},
        {&self->s_encodes, st, "encodes"},
        {&self->s_bytes, st, "bytes"},
        {&self->s_sends, st, "sends"},
    };
    if (fill_slots(slots, sizeof slots / sizeof slots[0]) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    if (llt != NULL) {
        /* (the link slots read at the stream link's offsets: Link's own, shared) */
        const char *shared[] = {"stalled", "sent_count", "released_count", "sent_bytes",
                                "released_bytes", "drops"};
        Py_ssize_t offsets[] = {self->l_stalled, self->l_sent_count, self->l_released_count,
                                self->l_sent_bytes, self->l_released_bytes, self->l_drops};
        for (size_t i = 0; i < 6; i++) {
            Py_ssize_t off = slot_offset(llt, shared[i]);
            if (off != offsets[i]) {
                if (off >= 0)
                    PyErr_Format(PyExc_TypeError, "PublishPath: %R.%s is not the link's slot",
                                 llt, shared[i]);
                Py_DECREF(self);
                return NULL;
            }
        }
        Py_INCREF(llt);
        self->local_link_type = llt;
        Py_INCREF(ld);
        self->local_deliver = ld;
        if ((self->ll_channel = slot_offset(llt, "channel")) < 0 ||
            (self->ll_needs_encoding = slot_offset(llt, "needs_encoding")) < 0 ||
            (self->c_checked = slot_offset(ct, "_last_checked")) < 0 ||
            (self->o_small_limit = slot_offset(ot, "_small_limit")) < 0) {
            Py_DECREF(self);
            return NULL;
        }
    }
    return (PyObject *)self;
}

/* One link's state, read and checked before anything changes. */
typedef struct {
    PyObject *link;
    long long sent_count, sent_bytes, drops, inline_sends, qmessages, qbytes;
} LinkState;

static int link_state(PublishPathObject *self, PyObject *link, LinkState *ls) {
    long long released_count, released_bytes;
    ls->link = link;
    return PyObject_TypeCheck(link, (PyTypeObject *)self->link_type) &&
           GET_LL(link, self->l_sent_count, ls->sent_count) &&
           GET_LL(link, self->l_sent_bytes, ls->sent_bytes) &&
           GET_LL(link, self->l_released_count, released_count) &&
           GET_LL(link, self->l_released_bytes, released_bytes) &&
           GET_LL(link, self->l_drops, ls->drops) && ls->drops >= 0 &&
           GET_LL(link, self->l_inline, ls->inline_sends) &&
           GET_LL(link, self->l_qmessages, ls->qmessages) &&
           GET_LL(link, self->l_qbytes, ls->qbytes) &&
           SLOT(link, self->l_queued) != NULL && PyList_CheckExact(SLOT(link, self->l_queued)) &&
           (ls->sent_count -= released_count, ls->sent_bytes -= released_bytes, 1);
    /* (sent_count / sent_bytes hold the in-flight figures here; see below) */
}

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

#define MAX_FAST_LINKS 8

static void fill_header(PublishPathObject *self, unsigned char *h, Py_ssize_t size, long long seq,
                        long long now, long long drops) {
    put_le(h, (uint64_t)(self->header_size + size), 4);
    h[4] = (unsigned char)self->data_kind;
    h[5] = 0;
    memset(h + 6, 0, 6);
    put_le(h + 12, (uint64_t)seq, 8);
    put_le(h + 20, (uint64_t)now, 8);
    put_le(h + 28, (uint64_t)drops, 8);
}

/* Outlet._hand_off(started) done here, when it is what that method would run: the
 * method is Outlet's own (not replaced on the class nor the instance), the outlet
 * module's _voluntary_switches, _sched_yield, time_ns and PACED_GAP_NS are the ones
 * given (the compiled switch count, os.sched_yield, time.time_ns, this path's gap), and
 * the outlet's _sent_ns and _slept are exact ints. 1: done; 0: not (nothing changed:
 * the caller calls the method); -1: an error. */
static int handoff_here(PublishPathObject *self, PyObject *outlet, long long started) {
#if defined(__linux__) && defined(RUSAGE_THREAD)
    if (self->ho_globals == NULL) return 0;
    PyObject *g = self->ho_globals;
    PyObject *gap = PyDict_GetItemWithError(g, str_g_gap);
    long long gap_ns, sent_ns, slept_before;
    if (PyDict_GetItemWithError(g, str_g_switches) != self->ho_switches ||
        PyDict_GetItemWithError(g, str_g_yield) != self->ho_yield ||
        PyDict_GetItemWithError(g, str_g_clock) != self->ho_clock || !exact_ll(gap, &gap_ns) ||
        gap_ns != self->paced_gap || !GET_LL(outlet, self->o_sent_ns, sent_ns) ||
        !GET_LL(outlet, self->o_slept, slept_before))
        return PyErr_Occurred() ? -1 : 0;
    PyObject *method = PyObject_GetAttr(outlet, str_hand_off);
    if (method == NULL) return -1;
    int own = PyMethod_Check(method) && PyMethod_GET_FUNCTION(method) == self->ho_method &&
              PyMethod_GET_SELF(method) == outlet;
    Py_DECREF(method);
    if (!own) return 0;
    if (started - sent_ns >= self->paced_gap) {
        struct rusage usage;
        if (getrusage(RUSAGE_THREAD, &usage) != 0) return 0;
        long long slept = usage.ru_nvcsw;
        if (slept != slept_before) {
            Py_BEGIN_ALLOW_THREADS
            sched_yield();
            Py_END_ALLOW_THREADS
            self->handoff_yields += 1;
        }
        if (set_ll(outlet, self->o_slept, slept) < 0) return -1;
    }
    if (set_ll(outlet, self->o_sent_ns, wall_ns()) < 0) return -1;
    self->handoffs += 1;
    return 1;
#else
    (void)self;
    (void)outlet;
    (void)started;
    return 0;
#endif
}

/* The paced message's send on its one *link*, as StreamLink.send_small writes the first
 * message of a loop turn when it is paced (no flush scheduled): its counters, the frame
 * written through *out* unless it is closing, its write time; then the outlet's handoff
 * (Outlet._hand_off, called: it decides and yields as the general path does). None, or
 * NULL with an exception (a Python call failed: the message was counted). */
static PyObject *publish_paced(PublishPathObject *self, PyObject *outlet, PyObject *link,
                               PyObject *out, PyObject *frame, Py_ssize_t size, long long seq,
                               long long now, int handoff) {
    LinkState ls;
    long long sent_count, sent_bytes;
    Py_INCREF(link);
    if (!GET_LL(link, self->l_sent_count, sent_count) ||
        !GET_LL(link, self->l_sent_bytes, sent_bytes) || !link_state(self, link, &ls)) {
        Py_DECREF(link);
        PyErr_SetString(PyExc_RuntimeError,
                        "publish_small: a link's state changed while a message was sent");
        return NULL;
    }
    fill_header(self, (unsigned char *)PyBytes_AS_STRING(frame), size, seq, now, ls.drops);
    PyObject *r = NULL;
    if (set_ll(link, self->l_sent_count, sent_count + 1) < 0 ||
        set_ll(link, self->l_sent_bytes, sent_bytes + size) < 0 ||
        set_ll(link, self->l_inline, ls.inline_sends + 1) < 0)
        goto done;
    PyObject *closing = PyObject_CallMethodNoArgs(out, str_is_closing);
    if (closing == NULL) goto done;
    int is_closing = PyObject_IsTrue(closing);
    Py_DECREF(closing);
    if (is_closing < 0) goto done;
    if (!is_closing) {
        PyObject *w = PyObject_CallMethodOneArg(out, str_write, frame);
        if (w == NULL) goto done;
        Py_DECREF(w);
    }
    if (set_ll(link, self->l_written, now) < 0) goto done;
    int here = handoff ? handoff_here(self, outlet, now) : 0;
    if (here < 0) goto done;
    if (handoff && !here) {
        PyObject *started = PyLong_FromLongLong(now);
        if (started == NULL) goto done;
        r = PyObject_CallMethodOneArg(outlet, str_hand_off, started);
        Py_DECREF(started);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    r = Py_None;
    Py_INCREF(r);
done:
    Py_DECREF(link);
    return r;
}

/* The outlet's _small_limit as a long long (LLONG_MAX past that range: a local link's
 * 2**63), or -1 when it is no exact int of 0 or more. (Slot found with the local
 * branch's: only where local_link_type was given.) */
static long long small_limit_of(PublishPathObject *self, PyObject *outlet) {
    PyObject *small = SLOT(outlet, self->o_small_limit);
    if (small == NULL || !PyLong_CheckExact(small)) return -1;
    int overflow = 0;
    long long limit = PyLong_AsLongLongAndOverflow(small, &overflow);
    if (limit == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (overflow) return overflow > 0 ? LLONG_MAX : -1;
    return limit < 0 ? -1 : limit;
}

/* 1 when a *size*-byte body goes inline on *link* (its out_of_line_above, an exact int,
 * at least *size*), 0 when not, -1 with an exception (the attribute's read failed). */
static int goes_inline(PyObject *link, Py_ssize_t size) {
    PyObject *above = PyObject_GetAttr(link, str_out_of_line_above);
    if (above == NULL) return -1;
    long long a;
    int ok = exact_ll(above, &a);
    Py_DECREF(above);
    return ok && size <= a;
}

/* Queue *f* - a frame of a *size*-byte body behind room for its header, filled here -
 * on stream link *link* as StreamLink.send_small queues a burst's frame: the link's
 * write time, sent and inline counters, its turn's queue, flushed at flush_messages /
 * flush_bytes (Python code: the caller reads what it needs again after). 0, or -1 with
 * an exception (a RuntimeError naming *who* when the link's state is no longer one
 * link_state reads). */
static int queue_burst_frame(PublishPathObject *self, PyObject *link, PyObject *f,
                             Py_ssize_t size, long long seq, long long now, const char *who) {
    LinkState ls;
    long long sent_count, sent_bytes;
    Py_INCREF(link);
    if (!GET_LL(link, self->l_sent_count, sent_count) ||
        !GET_LL(link, self->l_sent_bytes, sent_bytes) || !link_state(self, link, &ls)) {
        Py_DECREF(link);
        PyErr_Format(PyExc_RuntimeError, "%s: a link's state changed while a message was sent",
                     who);
        return -1;
    }
    fill_header(self, (unsigned char *)PyBytes_AS_STRING(f), size, seq, now, ls.drops);
    /* (_written_ns: the time of the link's last message, which tells its next loop
     * turn's first message whether it is paced) */
    int err = set_ll(link, self->l_written, now) < 0 ||
              set_ll(link, self->l_sent_count, sent_count + 1) < 0 ||
              set_ll(link, self->l_sent_bytes, sent_bytes + size) < 0 ||
              set_ll(link, self->l_inline, ls.inline_sends + 1) < 0 ||
              PyList_Append(SLOT(link, self->l_queued), f) < 0 ||
              set_ll(link, self->l_qmessages, ls.qmessages + 1) < 0 ||
              set_ll(link, self->l_qbytes, ls.qbytes + size) < 0;
    if (!err &&
        (ls.qmessages + 1 >= self->flush_messages || ls.qbytes + size >= self->flush_bytes)) {
        PyObject *r = PyObject_CallMethodNoArgs(link, str_flush);
        err = r == NULL;
        Py_XDECREF(r);
    }
    Py_DECREF(link);
    return err ? -1 : 0;
}

static PyObject *publish_local_send(PublishPathObject *self, PyObject *outlet, PyObject *link,
                                    PyObject *message, PyObject *body, long long relayed);

/* The local publish: publish_local_py's compiled twin (ezflow._transports._local), for an
 * outlet whose one link is of local_link_type. True: sent; False: nothing done (the
 * general path decides); NULL: an exception (the message's check raised something that
 * is not an Exception, or a delivery's Python code did). */
static PyObject *publish_local(PublishPathObject *self, PyObject *outlet, PyObject *link,
                               PyObject *message) {
    PyObject *codec = SLOT(outlet, self->o_codec);
    if (codec == NULL || !PyObject_TypeCheck(codec, (PyTypeObject *)self->codec_type))
        Py_RETURN_FALSE;
    PyObject *needs_encoding = SLOT(link, self->ll_needs_encoding);
    PyObject *body = NULL; /* (a new reference: the encoded body, for an encoding link) */
    long long limit;
    if (needs_encoding == Py_True) {
        /* The link takes the body too (an encoded subscriber): publish_nowait's small
         * body, the compiled template's encode_small (it may run Python code, a field's
         * getter: the state is read after it) */
        PyObject *template = SLOT(codec, self->c_template);
        if (template == NULL || template == Py_None ||
            !PyObject_TypeCheck(template, (PyTypeObject *)self->template_type) ||
            SLOT(template, self->t_kind) != (PyObject *)Py_TYPE(message))
            Py_RETURN_FALSE;
        PyObject *encode = SLOT(template, self->t_encode);
        if (encode == NULL || !PyCFunction_Check(encode) || PyCFunction_GET_SELF(encode) == NULL ||
            !Py_IS_TYPE(PyCFunction_GET_SELF(encode), &TemplateType) ||
            !exact_ll(SLOT(codec, self->c_limit), &limit))
            Py_RETURN_FALSE;
        /* (held: the encode may run Python code that replaces the codec's template) */
        PyObject *compiled = PyCFunction_GET_SELF(encode);
        Py_INCREF(compiled);
        body = encode_small_into((TemplateObject *)compiled, message,
                                 (Py_ssize_t)(limit > PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : limit), 0);
        Py_DECREF(compiled);
        if (body == NULL) return NULL;
        if (body == Py_None) {
            Py_DECREF(body);
            Py_RETURN_FALSE;
        }
        /* (the outlet's small limit: its links' smallest max_message_size, 2**63 for a
         * local link - beyond a long long: no limit) */
        long long small_limit = small_limit_of(self, outlet);
        if (small_limit < 0 || PyBytes_GET_SIZE(body) > small_limit) {
            Py_DECREF(body);
            Py_RETURN_FALSE;
        }
    } else if (needs_encoding == Py_False) {
        /* the check of the shape validated last (Codec.validate's hint), first: it may
         * run Python code (a field's getter), so the state is read after it */
        PyObject *hint = SLOT(codec, self->c_checked);
        if (hint == NULL || !PyTuple_CheckExact(hint) || PyTuple_GET_SIZE(hint) != 2 ||
            PyTuple_GET_ITEM(hint, 0) != (PyObject *)Py_TYPE(message))
            Py_RETURN_FALSE;
        PyObject *check = PyTuple_GET_ITEM(hint, 1);
        Py_INCREF(hint);
        PyObject *passed = PyObject_Vectorcall(check, &message, 1, NULL);
        Py_DECREF(hint);
        if (passed == NULL) return NULL;
        int ok = passed == Py_True;
        Py_DECREF(passed);
        if (!ok) Py_RETURN_FALSE;
    } else {
        Py_RETURN_FALSE;
    }
    PyObject *result = publish_local_send(self, outlet, link, message, body, -1);
    Py_XDECREF(body);
    return result;
}

/* publish_local's send, once the message passed its check or was encoded (*body*, or
 * NULL): the state read and checked, then the message sent, as publish_nowait sends
 * it. With *relayed* >= 0 (no body), the relay's instead (PublishPath.relay): the
 * message sent as send_objects sends one whose body has that many bytes - no yield
 * due checked or counted (its caller's loop does both), the body's bytes counted. True,
 * False (nothing done), or NULL (an exception). */
static PyObject *publish_local_send(PublishPathObject *self, PyObject *outlet, PyObject *link,
                                    PyObject *message, PyObject *body, long long relayed) {
    PyObject *links = SLOT(outlet, self->o_links);
    long long unyielded, unyielded_bytes, max_count, max_bytes, seq, sent_count, released_count,
        sent_bytes, released_bytes;
    Py_ssize_t size = body != NULL ? PyBytes_GET_SIZE(body) : 0;
    if (SLOT(self->tracing, self->tr_active) != Py_False || PyList_GET_SIZE(self->hooks) != 0 ||
        SLOT(outlet, self->o_closed) != Py_False || SLOT(outlet, self->o_handoff) != Py_False ||
        !GET_LL(outlet, self->o_unyielded, unyielded) ||
        (relayed < 0 && unyielded >= self->yield_after) ||
        !GET_LL(outlet, self->o_unyielded_bytes, unyielded_bytes) ||
        (relayed < 0 && unyielded_bytes >= self->yield_bytes) || links == NULL ||
        !PyList_CheckExact(links) ||
        PyList_GET_SIZE(links) != 1 || PyList_GET_ITEM(links, 0) != link ||
        SLOT(link, self->ll_needs_encoding) != (body != NULL ? Py_True : Py_False) ||
        SLOT(link, self->l_stalled) != Py_False || SLOT(link, self->ll_channel) == NULL ||
        !GET_LL(link, self->l_sent_count, sent_count) ||
        !GET_LL(link, self->l_released_count, released_count) ||
        !GET_LL(link, self->l_sent_bytes, sent_bytes) ||
        !GET_LL(link, self->l_released_bytes, released_bytes) ||
        SLOT(link, self->l_drops) == NULL || !GET_LL(outlet, self->o_max_count, max_count) ||
        !GET_LL(outlet, self->o_max_bytes, max_bytes) || !GET_LL(outlet, self->o_seq, seq))
        Py_RETURN_FALSE;
    long long count = sent_count - released_count;
    if (count >= max_count || (count && sent_bytes - released_bytes >= max_bytes))
        Py_RETURN_FALSE;

    /* From here on the message is sent: nothing declines. */
    if ((relayed < 0 && set_ll(outlet, self->o_unyielded, unyielded + 1) < 0) ||
        set_ll(outlet, self->o_seq, seq + 1) < 0 ||
        set_ll(link, self->l_sent_count, sent_count + 1) < 0)
        return NULL;
    /* _LocalLink.send(seq, now, message, None): the delivery in one call, else deliver */
    PyObject *channel = SLOT(link, self->ll_channel);
    PyObject *drops = SLOT(link, self->l_drops);
    Py_INCREF(channel);
    Py_INCREF(drops);
    PyObject *seq_obj = PyLong_FromLongLong(seq + 1);
    PyObject *now = PyLong_FromLongLong(wall_ns());
    PyObject *r = NULL;
    if (seq_obj != NULL && now != NULL) {
        /* (send_small's body for an encoding link: the one the channel's encoded
         * subscribers take, as it gives it) */
        PyObject *given = body != NULL ? body : Py_None;
        PyObject *dargs[6] = {channel, seq_obj, message, drops, now, given};
        r = PyObject_Vectorcall(self->local_deliver, dargs, 6, NULL);
        if (r != NULL && r != Py_True && body != NULL) {
            /* (as send_small: the body only while the channel has encoded subscribers) */
            PyObject *encoded = PyObject_GetAttr(channel, str_encoded);
            int has = encoded == NULL ? -1 : PyObject_IsTrue(encoded);
            Py_XDECREF(encoded);
            if (has < 0) {
                Py_DECREF(r);
                r = NULL;
            } else if (!has) {
                given = Py_None;
            }
        }
        if (r != NULL && r != Py_True) {
            Py_DECREF(r);
            r = NULL;
            if (PyObject_SetAttr(channel, str_body, given) == 0) {
                PyObject *zero = PyLong_FromLong(0);
                if (zero != NULL) {
                    r = PyObject_CallMethodObjArgs(channel, str_deliver, seq_obj, message, zero,
                                                   drops, now, NULL);
                    Py_DECREF(zero);
                }
            }
        }
    }
    Py_XDECREF(seq_obj);
    Py_XDECREF(now);
    Py_DECREF(drops);
    Py_DECREF(channel);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    /* (counted once the message is on its way, read again: a delivery runs callbacks) */
    PyObject *stats = SLOT(outlet, self->o_stats);
    long long s_messages, s_sends, s_encodes, s_bytes;
    if (stats == NULL || !PyObject_TypeCheck(stats, (PyTypeObject *)self->stats_type) ||
        !GET_LL(stats, self->s_messages, s_messages) || !GET_LL(stats, self->s_sends, s_sends) ||
        !GET_LL(stats, self->s_encodes, s_encodes) || !GET_LL(stats, self->s_bytes, s_bytes) ||
        !GET_LL(outlet, self->o_unyielded_bytes, unyielded_bytes)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "publish_local: the outlet's statistics changed while a message was sent");
        return NULL;
    }
    if (set_ll(stats, self->s_messages, s_messages + 1) < 0 ||
        set_ll(stats, self->s_sends, s_sends + 1) < 0)
        return NULL;
    if (body != NULL && (set_ll(outlet, self->o_unyielded_bytes, unyielded_bytes + size) < 0 ||
                         set_ll(stats, self->s_encodes, s_encodes + 1) < 0 ||
                         set_ll(stats, self->s_bytes, s_bytes + size) < 0))
        return NULL;
    if (relayed >= 0) {
        /* (send_objects: the body's bytes, and its yield share - its size, below
         * relay_share_below) */
        if (set_ll(outlet, self->o_unyielded_bytes, unyielded_bytes + relayed) < 0 ||
            set_ll(stats, self->s_bytes, s_bytes + relayed) < 0)
            return NULL;
        self->local_relays += 1;
    } else {
        self->local_publishes += 1;
    }
    Py_RETURN_TRUE;
}

/* PublishPath.relay(outlet, message, nbytes): _local.relay_local_py's compiled twin -
 * what send_objects(outlet, outlet._links, message, nbytes) does (Outlet.
 * publish_encoded_many's send of a relayed message to links that take no body) for an
 * outlet whose one link is of local_link_type and takes no body; True: sent; False:
 * nothing done (send_objects decides: a full window or stalled link, a closed outlet,
 * tracing, a hook, a message with a buffer - an array's read-only view is the general
 * path's -, a body of relay_share_below bytes or more); NULL: an exception. */
static PyObject *PublishPath_relay(PublishPathObject *self, PyObject *const *args,
                                   Py_ssize_t nargs) {
    long long nbytes;
    if (nargs != 3 || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "relay(outlet, message, nbytes: int)");
        return NULL;
    }
    PyObject *outlet = args[0], *message = args[1];
    if (self->local_link_type == NULL || !exact_ll(args[2], &nbytes) || nbytes < 0 ||
        nbytes >= self->relay_share_below ||
        !PyObject_TypeCheck(outlet, (PyTypeObject *)self->outlet_type) ||
        PyObject_CheckBuffer(message))
        Py_RETURN_FALSE;
    PyObject *one = SLOT(outlet, self->o_links);
    if (one == NULL || !PyList_CheckExact(one) || PyList_GET_SIZE(one) != 1 ||
        !Py_IS_TYPE(PyList_GET_ITEM(one, 0), (PyTypeObject *)self->local_link_type))
        Py_RETURN_FALSE;
    PyObject *link = PyList_GET_ITEM(one, 0);
    Py_INCREF(link);
    PyObject *r = publish_local_send(self, outlet, link, message, NULL, nbytes);
    Py_DECREF(link);
    return r;
}

/* PublishPath.relay_stream(outlet, message, body): _stream_publish.relay_stream_py's
 * compiled twin - what Outlet._send_small(links, message, body, relayed=True) does
 * (publish_encoded_many's send of a relayed small body to links that take it as one)
 * when every link is a stream link collecting this loop turn's frames with room in its
 * window: one DATA frame (header + *body*) queued on each, as StreamLink.send_small
 * queues a burst's (a queue flushed at flush_messages / flush_bytes), the links' sent
 * and inline counters, the outlet's seq, its yield bytes (the body's size, below
 * relay_share_below: yield_share's rule) and statistics (no encode). The yield count
 * is its caller's loop's. True: sent; False: nothing done (_send_small decides: a body
 * that is not exact bytes or reaches relay_share_below or a link's out_of_line_above or
 * the outlet's small limit, a paced link, a stalled or full one, no link or more than
 * MAX_FAST_LINKS, a closed outlet, a handoff one whose last send is not within the
 * paced gap, tracing, a hook); NULL: an exception. A handoff outlet's send time is
 * noted, as Outlet._hand_off notes it in a burst. */
static PyObject *PublishPath_relay_stream(PublishPathObject *self, PyObject *const *args,
                                          Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "relay_stream(outlet, message, body)");
        return NULL;
    }
    PyObject *outlet = args[0], *body = args[2];
    long long max_count, max_bytes, seq, small_limit, unyielded_bytes;
    /* (the outlet's small limit is a slot found with the local branch's: none without) */
    if (self->local_link_type == NULL || !PyBytes_CheckExact(body) ||
        PyBytes_GET_SIZE(body) >= self->relay_share_below ||
        !PyObject_TypeCheck(outlet, (PyTypeObject *)self->outlet_type) ||
        SLOT(outlet, self->o_closed) != Py_False ||
        SLOT(self->tracing, self->tr_active) != Py_False || PyList_GET_SIZE(self->hooks) != 0)
        Py_RETURN_FALSE;
    /* A handoff outlet in a burst (its last send within the paced gap): Outlet._hand_off
     * only notes the send time, done below; a paced one is _send_small's, which decides */
    long long now = wall_ns(), sent_ns = 0;
    PyObject *handoff = SLOT(outlet, self->o_handoff);
    if ((handoff != Py_True && handoff != Py_False) ||
        (handoff == Py_True &&
         (!GET_LL(outlet, self->o_sent_ns, sent_ns) || now - sent_ns >= self->paced_gap)))
        Py_RETURN_FALSE;
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    PyObject *links = SLOT(outlet, self->o_links);
    small_limit = small_limit_of(self, outlet);
    if (small_limit < size || links == NULL || !PyList_CheckExact(links) ||
        PyList_GET_SIZE(links) < 1 || PyList_GET_SIZE(links) > MAX_FAST_LINKS ||
        !GET_LL(outlet, self->o_max_count, max_count) ||
        !GET_LL(outlet, self->o_max_bytes, max_bytes) || !GET_LL(outlet, self->o_seq, seq))
        Py_RETURN_FALSE;
    Py_ssize_t nlinks = PyList_GET_SIZE(links);
    for (Py_ssize_t i = 0; i < nlinks; i++) {
        PyObject *link = PyList_GET_ITEM(links, i);
        LinkState ls;
        if (!link_state(self, link, &ls) || SLOT(link, self->l_stalled) != Py_False ||
            SLOT(link, self->l_flush) != Py_True)
            Py_RETURN_FALSE;
        if (ls.sent_count >= max_count || (ls.sent_count && ls.sent_bytes >= max_bytes))
            Py_RETURN_FALSE;
        int fits = goes_inline(link, size);
        if (fits < 0) return NULL;
        if (!fits) Py_RETURN_FALSE;
    }
    /* (the attribute reads above run no code of ours, but a property could: read again) */
    if (SLOT(outlet, self->o_links) != links || PyList_GET_SIZE(links) != nlinks)
        Py_RETURN_FALSE;

    /* From here on the message is sent: nothing declines. */
    Py_INCREF(links);
    PyObject *result = NULL;
    Py_ssize_t prefix = 4 + self->header_size;
    seq += 1;
    if (set_ll(outlet, self->o_seq, seq) < 0) goto done;
    Py_ssize_t sends = 0;
    for (Py_ssize_t i = 0; i < nlinks; i++) {
        if (i >= PyList_GET_SIZE(links)) break; /* (a flush removed links: as a for loop) */
        PyObject *f = PyBytes_FromStringAndSize(NULL, prefix + size);
        if (f == NULL) goto done;
        memcpy(PyBytes_AS_STRING(f) + prefix, PyBytes_AS_STRING(body), (size_t)size);
        int err = queue_burst_frame(self, PyList_GET_ITEM(links, i), f, size, seq, now,
                                    "relay_stream");
        Py_DECREF(f);
        if (err) goto done;
        sends += 1;
    }
    if (handoff == Py_True && set_ll(outlet, self->o_sent_ns, wall_ns()) < 0) goto done;
    /* (read again: a flush runs Python code) */
    PyObject *stats = SLOT(outlet, self->o_stats);
    long long s_messages, s_bytes, s_sends;
    if (!GET_LL(outlet, self->o_unyielded_bytes, unyielded_bytes) || stats == NULL ||
        !PyObject_TypeCheck(stats, (PyTypeObject *)self->stats_type) ||
        !GET_LL(stats, self->s_messages, s_messages) || !GET_LL(stats, self->s_bytes, s_bytes) ||
        !GET_LL(stats, self->s_sends, s_sends)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "relay_stream: the outlet's state changed while a message was sent");
        goto done;
    }
    if (set_ll(outlet, self->o_unyielded_bytes, unyielded_bytes + size) < 0 ||
        set_ll(stats, self->s_messages, s_messages + 1) < 0 ||
        set_ll(stats, self->s_bytes, s_bytes + size) < 0 ||
        set_ll(stats, self->s_sends, s_sends + sends) < 0)
        goto done;
    self->stream_relays += 1;
    result = Py_NewRef(Py_True);
done:
    Py_DECREF(links);
    return result;
}

static PyObject *PublishPath_publish(PublishPathObject *self, PyObject *const *args,
                                     Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "publish(outlet, message)");
        return NULL;
    }
    PyObject *outlet = args[0], *message = args[1];
    if (!PyObject_TypeCheck(outlet, (PyTypeObject *)self->outlet_type)) Py_RETURN_FALSE;
    if (self->local_link_type != NULL) {
        /* (an outlet whose one link is a local one: the local publish) */
        PyObject *one = SLOT(outlet, self->o_links);
        if (one != NULL && PyList_CheckExact(one) && PyList_GET_SIZE(one) == 1 &&
            Py_IS_TYPE(PyList_GET_ITEM(one, 0), (PyTypeObject *)self->local_link_type)) {
            PyObject *link = PyList_GET_ITEM(one, 0);
            Py_INCREF(link);
            PyObject *r = publish_local(self, outlet, link, message);
            Py_DECREF(link);
            return r;
        }
    }
    long long unyielded, unyielded_bytes, fast_limit, max_count, max_bytes, seq, sent_ns = 0,
                                                                                 limit;
    PyObject *closed = SLOT(outlet, self->o_closed);
    if (closed != Py_False || !GET_LL(outlet, self->o_unyielded, unyielded) ||
        unyielded >= self->yield_after)
        Py_RETURN_FALSE;
    if (!GET_LL(outlet, self->o_fast_limit, fast_limit) || fast_limit < 0 ||
        !GET_LL(outlet, self->o_unyielded_bytes, unyielded_bytes) ||
        unyielded_bytes >= self->yield_bytes || SLOT(self->tracing, self->tr_active) != Py_False ||
        PyList_GET_SIZE(self->hooks) != 0)
        Py_RETURN_FALSE;
    PyObject *links = SLOT(outlet, self->o_links);
    if (links == NULL || !PyList_CheckExact(links) ||
        !GET_LL(outlet, self->o_max_count, max_count) ||
        !GET_LL(outlet, self->o_max_bytes, max_bytes))
        Py_RETURN_FALSE;
    Py_ssize_t nlinks = PyList_GET_SIZE(links);
    if (nlinks > MAX_FAST_LINKS) Py_RETURN_FALSE;
    /* paced: the one link is not collecting a loop turn's frames: the message is written
     * at once (StreamLink.send_small's first write), then the outlet's handoff */
    int paced = 0;
    for (Py_ssize_t i = 0; i < nlinks; i++) {
        PyObject *link = PyList_GET_ITEM(links, i);
        LinkState ls;
        PyObject *collecting = SLOT(link, self->l_flush);
        if (!PyObject_TypeCheck(link, (PyTypeObject *)self->link_type) ||
            SLOT(link, self->l_stalled) != Py_False ||
            (collecting != Py_True && (collecting != Py_False || nlinks != 1)) ||
            !link_state(self, link, &ls))
            Py_RETURN_FALSE;
        if (collecting == Py_False) {
            /* (a write within the paced gap: a burst's first message of a loop turn,
             * for send_small, which schedules the turn's flush) */
            long long written_ns;
            if (!GET_LL(link, self->l_written, written_ns) ||
                wall_ns() - written_ns < self->paced_gap)
                Py_RETURN_FALSE;
            paced = 1;
        }
        long long count = ls.sent_count, nbytes = ls.sent_bytes; /* in flight */
        if (count >= max_count || (count && nbytes >= max_bytes)) Py_RETURN_FALSE;
    }
    PyObject *codec = SLOT(outlet, self->o_codec);
    if (codec == NULL || !PyObject_TypeCheck(codec, (PyTypeObject *)self->codec_type))
        Py_RETURN_FALSE;
    PyObject *template = SLOT(codec, self->c_template);
    if (template == NULL || template == Py_None ||
        !PyObject_TypeCheck(template, (PyTypeObject *)self->template_type))
        Py_RETURN_FALSE;
    PyObject *kind = SLOT(template, self->t_kind);
    PyObject *encode = SLOT(template, self->t_encode);
    PyObject *limit_obj = SLOT(codec, self->c_limit);
    if (kind != (PyObject *)Py_TYPE(message) || encode == NULL || limit_obj == NULL)
        Py_RETURN_FALSE;

    /* the body, with room for the first link's frame prefix in front of it */
    Py_ssize_t prefix = 4 + self->header_size;
    PyObject *frame;
    Py_ssize_t size;
    if (PyCFunction_Check(encode) && PyCFunction_GET_SELF(encode) != NULL &&
        Py_IS_TYPE(PyCFunction_GET_SELF(encode), &TemplateType) && exact_ll(limit_obj, &limit)) {
        /* the compiled template's encode_small, called directly */
        frame = encode_small_into((TemplateObject *)PyCFunction_GET_SELF(encode), message,
                                  (Py_ssize_t)(limit > PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : limit),
                                  prefix);
        if (frame == NULL) return NULL;
        if (frame == Py_None) {
            Py_DECREF(frame);
            Py_RETURN_FALSE;
        }
        size = PyBytes_GET_SIZE(frame) - prefix;
    } else {
        PyObject *cargs[2] = {message, limit_obj};
        PyObject *body = PyObject_Vectorcall(encode, cargs, 2, NULL);
        if (body == NULL) return NULL;
        if (body == Py_None) {
            Py_DECREF(body);
            Py_RETURN_FALSE;
        }
        if (!PyBytes_CheckExact(body)) {
            Py_DECREF(body);
            Py_RETURN_FALSE;
        }
        size = PyBytes_GET_SIZE(body);
        frame = PyBytes_FromStringAndSize(NULL, prefix + size);
        if (frame == NULL) {
            Py_DECREF(body);
            return NULL;
        }
        memcpy(PyBytes_AS_STRING(frame) + prefix, PyBytes_AS_STRING(body), (size_t)size);
        Py_DECREF(body);
    }
    if (size > fast_limit) goto decline;
    /* (the encode ran Python code only on the uncompiled template: the links may have
     * changed meanwhile; read again below, and checked as before) */
    nlinks = PyList_GET_SIZE(links);
    for (Py_ssize_t i = 0; i < nlinks; i++) {
        int fits = goes_inline(PyList_GET_ITEM(links, i), size);
        if (fits < 0) goto fail;
        if (!fits) goto decline;
    }
    long long now = wall_ns();
    PyObject *handoff = SLOT(outlet, self->o_handoff);
    if (handoff != Py_True && handoff != Py_False) goto decline;
    PyObject *out = NULL; /* (paced: the link's write half, a new reference) */
    if (paced) {
        PyObject *connection = SLOT(PyList_GET_ITEM(links, 0), self->l_connection);
        if (connection == NULL) goto decline;
        out = PyObject_GetAttr(connection, str_out);
        if (out == NULL) goto fail;
        if (out == Py_None) {
            Py_DECREF(out);
            goto decline;
        }
    } else if (handoff == Py_True &&
               (!GET_LL(outlet, self->o_sent_ns, sent_ns) || now - sent_ns >= self->paced_gap))
        goto decline;
    PyObject *stats = SLOT(outlet, self->o_stats);
    long long s_messages, s_encodes, s_bytes, s_sends;
    int ready = GET_LL(outlet, self->o_seq, seq) && stats != NULL &&
                PyObject_TypeCheck(stats, (PyTypeObject *)self->stats_type) &&
                GET_LL(stats, self->s_messages, s_messages) &&
                GET_LL(stats, self->s_encodes, s_encodes) &&
                GET_LL(stats, self->s_bytes, s_bytes) && GET_LL(stats, self->s_sends, s_sends);
    for (Py_ssize_t i = 0; ready && i < nlinks; i++) {
        LinkState ls;
        ready = link_state(self, PyList_GET_ITEM(links, i), &ls);
    }
    if (!ready) {
        Py_XDECREF(out);
        goto decline;
    }

    /* From here on the message is sent: nothing declines. */
    seq += 1;
    if (set_ll(outlet, self->o_seq, seq) < 0) {
        Py_XDECREF(out);
        goto fail;
    }
    if (paced) {
        PyObject *r = publish_paced(self, outlet, PyList_GET_ITEM(links, 0), out, frame, size,
                                    seq, now, handoff == Py_True);
        Py_DECREF(out);
        Py_DECREF(frame);
        frame = NULL;
        if (r == NULL) return NULL;
        Py_DECREF(r);
        goto counted;
    }
    for (Py_ssize_t i = 0; i < nlinks; i++) {
        if (i >= PyList_GET_SIZE(links)) break; /* (a flush removed links: as a for loop) */
        PyObject *f = frame;
        if (i > 0) {
            f = PyBytes_FromStringAndSize(PyBytes_AS_STRING(frame), prefix + size);
            if (f == NULL) goto fail;
        } else {
            Py_INCREF(f);
        }
        int err = queue_burst_frame(self, PyList_GET_ITEM(links, i), f, size, seq, now,
                                    "publish_small");
        Py_DECREF(f);
        if (err) goto fail;
    }
    Py_DECREF(frame);
    frame = NULL;
    if (handoff == Py_True && set_ll(outlet, self->o_sent_ns, wall_ns()) < 0) return NULL;
counted:
    /* (read again: a flush, a write and a handoff run Python code) */
    if (!GET_LL(outlet, self->o_unyielded, unyielded) ||
        !GET_LL(outlet, self->o_unyielded_bytes, unyielded_bytes))
        goto changed;
    if (set_ll(outlet, self->o_unyielded, unyielded + 1) < 0 ||
        set_ll(outlet, self->o_unyielded_bytes, unyielded_bytes + size) < 0)
        return NULL;
    stats = SLOT(outlet, self->o_stats);
    if (stats == NULL || !PyObject_TypeCheck(stats, (PyTypeObject *)self->stats_type) ||
        !GET_LL(stats, self->s_messages, s_messages) ||
        !GET_LL(stats, self->s_encodes, s_encodes) || !GET_LL(stats, self->s_bytes, s_bytes) ||
        !GET_LL(stats, self->s_sends, s_sends))
        goto changed;
    if (set_ll(stats, self->s_messages, s_messages + 1) < 0 ||
        set_ll(stats, self->s_encodes, s_encodes + 1) < 0 ||
        set_ll(stats, self->s_bytes, s_bytes + size) < 0 ||
        set_ll(stats, self->s_sends, s_sends + PyList_GET_SIZE(links)) < 0)
        return NULL;
    Py_RETURN_TRUE;
changed:
    PyErr_SetString(PyExc_RuntimeError,
                    "publish_small: the outlet's state changed while a message was sent");
    return NULL;
decline:
    Py_DECREF(frame);
    Py_RETURN_FALSE;
fail:
    Py_XDECREF(frame);
    return NULL;
}

static PyMethodDef PublishPath_methods[] = {
    {"publish", (PyCFunction)(void (*)(void))PublishPath_publish, METH_FASTCALL,
     "publish(outlet, message) -> bool: publish_small_py's compiled twin (True: sent; "
     "False: nothing done, the general path decides)."},
    {"relay", (PyCFunction)(void (*)(void))PublishPath_relay, METH_FASTCALL,
     "relay(outlet, message, nbytes) -> bool: _local.relay_local_py's compiled twin (True: "
     "sent; False: nothing done, send_objects decides)."},
    {"relay_stream", (PyCFunction)(void (*)(void))PublishPath_relay_stream, METH_FASTCALL,
     "relay_stream(outlet, message, body) -> bool: _stream_publish.relay_stream_py's "
     "compiled twin (True: sent; False: nothing done, Outlet._send_small decides)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef PublishPath_members[] = {
    {"handoffs", T_LONGLONG, offsetof(PublishPathObject, handoffs), READONLY,
     "paced handoffs done here (not by calling Outlet._hand_off)"},
    {"handoff_yields", T_LONGLONG, offsetof(PublishPathObject, handoff_yields), READONLY,
     "the sched_yield calls among them"},
    {"local_publishes", T_LONGLONG, offsetof(PublishPathObject, local_publishes), READONLY,
     "messages sent by the local publish (publish_local_py's twin)"},
    {"local_relays", T_LONGLONG, offsetof(PublishPathObject, local_relays), READONLY,
     "messages sent by the local relay (relay_local_py's twin)"},
    {"stream_relays", T_LONGLONG, offsetof(PublishPathObject, stream_relays), READONLY,
     "messages sent by the stream relay (relay_stream_py's twin)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PublishPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ezflow._core._speedups.PublishPath",
    .tp_basicsize = sizeof(PublishPathObject),
    .tp_dealloc = (destructor)PublishPath_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled one-call small publish (publish_small_py's twin).",
    .tp_methods = PublishPath_methods,
    .tp_members = PublishPath_members,
    .tp_new = PublishPath_new,
};

/* ---------------------------------------------------------------- TakePath */

/* TakePath(inbox_type, attachment_type, channel_type, stats_type, histogram_type,
 *          deque_type, nothing, sample_mask)
 *   Its take(inbox) is the compiled twin of ezflow._core._inbox.take_queued_py: the
 *   oldest queued message of a queueing inbox taken as Inbox.get takes it (counted, its
 *   handler time sampled, its release to a lossless channel's first pending entry done,
 *   the channel's on_release called when the cumulative release grows), or *nothing*
 *   when the general path must decide (an empty queue, a traced or undecodable item, a
 *   release that is not of the first pending entry or that advances more than it). The
 *   state is read and written in the objects' __slots__, as PublishPath does. */

typedef struct {
    PyObject_HEAD
    PyObject *inbox_type, *attachment_type, *channel_type, *stats_type, *histogram_type,
        *deque_type, *nothing, *popleft;
    long long sample_mask;
    Py_ssize_t i_items, i_open_hop, i_stats, i_handed, i_handler;
    Py_ssize_t s_taken, h_buckets, h_total;
    Py_ssize_t a_lossless, a_active, a_channel, a_consumed;
    Py_ssize_t c_pending, c_pending_bytes, c_released_count, c_released_bytes, c_on_release;
    Py_ssize_t c_quiet_count, c_quiet_bytes;
} TakePathObject;

static long long perf_ns(void) {
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    if (PyTime_PerfCounter(&t) < 0) {
        PyErr_Clear();
        return 0;
    }
    return (long long)t;
#else
    return (long long)_PyTime_GetPerfCounter();
#endif
}

static int bit_length(unsigned long long v) {
    int n = 0;
    while (v) {
        n++;
        v >>= 1;
    }
    return n;
}

/* Add one to bucket *bucket* of a histogram's *buckets* list; -1 (a RuntimeError naming
 * *who*) when it is no longer a list of ints that long. */
static int add_to_bucket(PyObject *buckets, Py_ssize_t bucket, const char *who) {
    long long b;
    if (buckets == NULL || !PyList_CheckExact(buckets) || bucket < 0 ||
        bucket >= PyList_GET_SIZE(buckets) || !exact_ll(PyList_GET_ITEM(buckets, bucket), &b)) {
        PyErr_Format(PyExc_RuntimeError, "%s: a histogram bucket changed", who);
        return -1;
    }
    PyObject *n = PyLong_FromLongLong(b + 1);
    if (n == NULL) return -1;
    PyList_SetItem(buckets, bucket, n); /* (steals n, drops the old count) */
    return 0;
}

static void TakePath_dealloc(TakePathObject *self) {
    Py_XDECREF(self->inbox_type);
    Py_XDECREF(self->attachment_type);
    Py_XDECREF(self->channel_type);
    Py_XDECREF(self->stats_type);
    Py_XDECREF(self->histogram_type);
    Py_XDECREF(self->deque_type);
    Py_XDECREF(self->nothing);
    Py_XDECREF(self->popleft);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *TakePath_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *it, *at, *ct, *st, *ht, *dt, *nothing;
    long long mask;
    static char *kwlist[] = {"inbox_type", "attachment_type", "channel_type", "stats_type",
                             "histogram_type", "deque_type", "nothing", "sample_mask",
                             NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOL:TakePath", kwlist, &it, &at, &ct,
                                     &st, &ht, &dt, &nothing, &mask))
        return NULL;
    TakePathObject *self = (TakePathObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject **refs[] = {&self->inbox_type, &self->attachment_type, &self->channel_type,
                         &self->stats_type, &self->histogram_type, &self->deque_type,
                         &self->nothing};
    PyObject *values[] = {it, at, ct, st, ht, dt, nothing};
    for (size_t i = 0; i < 7; i++) {
        Py_INCREF(values[i]);
        *refs[i] = values[i];
    }
    self->sample_mask = mask;
    self->popleft = PyObject_GetAttrString(dt, "popleft");
    if (self->popleft == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    SlotSpec slots[] = {
        {&self->i_items, it, "_items"},
        {&self->i_open_hop, it, "_open_hop"},
        {&self->i_stats, it, "stats"},
        {&self->i_handed, it, "_handed_ns"},
        {&self->i_handler, it, "handler_time"},
        {&self->s_taken, st, "taken"},
        {&self->h_buckets, ht, "buckets"},
        {&self->h_total, ht, "total"},
        {&self->a_lossless, at, "lossless"},
        {&self->a_active, at, "active"},
        {&self->a_channel, at, "channel"},
        {&self->a_consumed, at, "consumed_seq"},
        {&self->c_pending, ct, "_pending"},
        {&self->c_pending_bytes, ct, "_pending_bytes"},
        {&self->c_released_count, ct, "_released_count"},
        {&self->c_released_bytes, ct, "_released_bytes"},
        {&self->c_on_release, ct, "on_release"},
        {&self->c_quiet_count, ct, "release_quiet_count"},
        {&self->c_quiet_bytes, ct, "release_quiet_bytes"},
    };
    if (fill_slots(slots, sizeof slots / sizeof slots[0]) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

#define NOTHING_BACK(self) return Py_NewRef((self)->nothing)

static PyObject *TakePath_take(TakePathObject *self, PyObject *inbox) {
    if (!PyObject_TypeCheck(inbox, (PyTypeObject *)self->inbox_type)) NOTHING_BACK(self);
    PyObject *items = SLOT(inbox, self->i_items);
    if (items == NULL || (PyObject *)Py_TYPE(items) != self->deque_type || Py_SIZE(items) < 1 ||
        SLOT(inbox, self->i_open_hop) != Py_None)
        NOTHING_BACK(self);
    PyObject *stats = SLOT(inbox, self->i_stats);
    PyObject *handler = SLOT(inbox, self->i_handler);
    long long taken, handed, total = 0;
    if (stats == NULL || !PyObject_TypeCheck(stats, (PyTypeObject *)self->stats_type) ||
        !GET_LL(stats, self->s_taken, taken) || !GET_LL(inbox, self->i_handed, handed) ||
        handler == NULL || !PyObject_TypeCheck(handler, (PyTypeObject *)self->histogram_type))
        NOTHING_BACK(self);
    PyObject *buckets = SLOT(handler, self->h_buckets);
    if (handed && (buckets == NULL || !PyList_CheckExact(buckets) ||
                   !GET_LL(handler, self->h_total, total)))
        NOTHING_BACK(self);
    PyObject *item = PySequence_GetItem(items, 0);
    if (item == NULL) return NULL;
    PyObject *result = NULL, *entry = NULL;
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 3) goto nothing;
    PyObject *attachment = PyTuple_GET_ITEM(item, 0), *message = PyTuple_GET_ITEM(item, 2);
    long long seq;
    if (!PyObject_TypeCheck(attachment, (PyTypeObject *)self->attachment_type) ||
        !exact_ll(PyTuple_GET_ITEM(item, 1), &seq))
        goto nothing;
    PyObject *lossless = SLOT(attachment, self->a_lossless);
    PyObject *active = SLOT(attachment, self->a_active);
    if ((lossless != Py_True && lossless != Py_False) || (active != Py_True && active != Py_False))
        goto nothing;
    int release = lossless == Py_True && active == Py_True;
    PyObject *channel = NULL, *pending = NULL;
    long long count = 0, nbytes = 0, pending_bytes = 0, released_count = 0, released_bytes = 0;
    long long quiet_count = 0, quiet_bytes = 0;
    int later = 0; /* the entry is not the first pending one */
    if (release) {
        channel = SLOT(attachment, self->a_channel);
        if (channel == NULL || !PyObject_TypeCheck(channel, (PyTypeObject *)self->channel_type))
            goto nothing;
        pending = SLOT(channel, self->c_pending);
        if (pending == NULL || (PyObject *)Py_TYPE(pending) != self->deque_type) goto nothing;
        if (Py_SIZE(pending) > 0) {
            entry = PySequence_GetItem(pending, 0);
            if (entry == NULL) goto done;
            long long first;
            if (!PyList_CheckExact(entry) || PyList_GET_SIZE(entry) != 3 ||
                !exact_ll(PyList_GET_ITEM(entry, 0), &first))
                goto nothing;
            if (first != seq) {
                /* Not the first (a release deferred to the loop holds it): where it is
                 * when no seq is missing between, counted down, never advancing. */
                long long index = seq - first, at;
                if (index <= 0 || index >= Py_SIZE(pending)) goto nothing;
                Py_DECREF(entry);
                entry = PySequence_GetItem(pending, (Py_ssize_t)index);
                if (entry == NULL) goto done;
                if (!PyList_CheckExact(entry) || PyList_GET_SIZE(entry) != 3 ||
                    !exact_ll(PyList_GET_ITEM(entry, 0), &at) || at != seq ||
                    !exact_ll(PyList_GET_ITEM(entry, 1), &count))
                    goto nothing;
                count -= 1;
                later = 1;
            } else if (!exact_ll(PyList_GET_ITEM(entry, 1), &count) ||
                       !exact_ll(PyList_GET_ITEM(entry, 2), &nbytes)) {
                goto nothing;
            } else {
                count -= 1;
            }
            if (count <= 0 && !later) {
                if (Py_SIZE(pending) > 1) {
                    /* (the next entry released too: Channel._advance's business) */
                    PyObject *second = PySequence_GetItem(pending, 1);
                    if (second == NULL) goto done;
                    long long next_count;
                    int ok = PyList_CheckExact(second) && PyList_GET_SIZE(second) == 3 &&
                             exact_ll(PyList_GET_ITEM(second, 1), &next_count) &&
                             next_count > 0;
                    Py_DECREF(second);
                    if (!ok) goto nothing;
                }
                if (!GET_LL(channel, self->c_pending_bytes, pending_bytes) ||
                    !GET_LL(channel, self->c_released_count, released_count) ||
                    !GET_LL(channel, self->c_released_bytes, released_bytes) ||
                    !GET_LL(channel, self->c_quiet_count, quiet_count) ||
                    !GET_LL(channel, self->c_quiet_bytes, quiet_bytes) ||
                    SLOT(channel, self->c_on_release) == NULL)
                    goto nothing;
            }
        }
    }
    /* the handler-time sample: the clock read (and the bucket checked) before any change */
    long long now = 0;
    Py_ssize_t bucket = -1;
    if (handed) {
        now = perf_ns();
        long long spent = now - handed;
        bucket = bit_length((unsigned long long)(spent < 0 ? -spent : spent));
        if (bucket >= PyList_GET_SIZE(buckets) ||
            !PyLong_CheckExact(PyList_GET_ITEM(buckets, bucket)))
            goto nothing;
        total += spent;
    } else if (!(seq & self->sample_mask)) {
        now = perf_ns();
    }

    /* From here on the message is taken. */
    PyObject *popped = PyObject_Vectorcall(self->popleft, &items, 1, NULL);
    if (popped == NULL) goto done;
    Py_DECREF(popped);
    if (set_ll(stats, self->s_taken, taken + 1) < 0) goto done;
    if (handed) {
        if (add_to_bucket(buckets, bucket, "take") < 0 ||
            set_ll(handler, self->h_total, total) < 0 || set_ll(inbox, self->i_handed, 0) < 0)
            goto done;
    } else if (!(seq & self->sample_mask)) {
        if (set_ll(inbox, self->i_handed, now) < 0) goto done;
    }
    if (release) {
        if (set_ll(attachment, self->a_consumed, seq) < 0) goto done;
        if (entry != NULL) {
            PyObject *n = PyLong_FromLongLong(count);
            if (n == NULL) goto done;
            PyList_SetItem(entry, 1, n);
            if (count <= 0 && !later) {
                popped = PyObject_Vectorcall(self->popleft, &pending, 1, NULL);
                if (popped == NULL) goto done;
                Py_DECREF(popped);
                if (set_ll(channel, self->c_pending_bytes, pending_bytes - nbytes) < 0 ||
                    set_ll(channel, self->c_released_count, released_count + 1) < 0 ||
                    set_ll(channel, self->c_released_bytes, released_bytes + nbytes) < 0)
                    goto done;
                /* (Channel.release's rule: no call while both figures stay below the
                 * channel's quiet marks) */
                PyObject *callback = SLOT(channel, self->c_on_release);
                if (callback != NULL && callback != Py_None &&
                    (released_count + 1 >= quiet_count ||
                     released_bytes + nbytes >= quiet_bytes)) {
                    Py_INCREF(callback);
                    PyObject *cargs[2] = {SLOT(channel, self->c_released_count),
                                          SLOT(channel, self->c_released_bytes)};
                    PyObject *r = PyObject_Vectorcall(callback, cargs, 2, NULL);
                    Py_DECREF(callback);
                    if (r == NULL) goto done;
                    Py_DECREF(r);
                }
            }
        }
    }
    result = Py_NewRef(message);
    goto done;
nothing:
    result = Py_NewRef(self->nothing);
done:
    Py_XDECREF(entry);
    Py_DECREF(item);
    return result;
}

static PyMethodDef TakePath_methods[] = {
    {"take", (PyCFunction)TakePath_take, METH_O,
     "take(inbox) -> the message, or nothing: take_queued_py's compiled twin."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TakePathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ezflow._core._speedups.TakePath",
    .tp_basicsize = sizeof(TakePathObject),
    .tp_dealloc = (destructor)TakePath_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled take of a queued message (take_queued_py's twin).",
    .tp_methods = TakePath_methods,
    .tp_new = TakePath_new,
};

/* ---------------------------------------------------------------- DeliverPath */

/* DeliverPath(channel_type, channel_stats_type, attachment_type, inbox_type,
 *             inbox_stats_type, histogram_type, deque_type, hooks)
 *   Its deliver(channel, seq, message, upstream_drops, sent_ns, body) is the compiled
 *   twin of ezflow._core._channel_local.deliver_local_py: a message of no bytes from a
 *   publisher in this process delivered as Channel.deliver (and Inbox.put) would,
 *   returning True, when that is the common case (a plain Channel - whose encoded
 *   inboxes, if any, take *body*, a bytes object, as put_encoded hands them a small
 *   body - no deliver hook in *hooks*, no new upstream drop, every inbox a plain Inbox):
 *   a queueing inbox's append done here, anything else (a callback, a waiting task, a
 *   full or closed inbox) by Inbox.put (or its _call). Else False, nothing changed.
 *   The state is read and written in the objects' __slots__, as TakePath does. */

typedef struct {
    PyObject_HEAD
    PyObject *channel_type, *channel_stats_type, *attachment_type, *inbox_type,
        *inbox_stats_type, *histogram_type, *deque_type, *hooks, *append;
    Py_ssize_t c_encoded, c_body, c_stats, c_attachments, c_last_seq, c_lossless, c_pending,
        c_released_count, c_latency;
    Py_ssize_t cs_upstream, cs_messages, cs_deliveries;
    Py_ssize_t a_inbox, a_encoded;
    Py_ssize_t i_closed, i_callback, i_waiter, i_maxlen, i_items, i_stats;
    Py_ssize_t is_received, h_buckets, h_total;
} DeliverPathObject;

static PyObject *str_notify_release, *str_call, *str_put;

static void DeliverPath_dealloc(DeliverPathObject *self) {
    Py_XDECREF(self->channel_type);
    Py_XDECREF(self->channel_stats_type);
    Py_XDECREF(self->attachment_type);
    Py_XDECREF(self->inbox_type);
    Py_XDECREF(self->inbox_stats_type);
    Py_XDECREF(self->histogram_type);
    Py_XDECREF(self->deque_type);
    Py_XDECREF(self->hooks);
    Py_XDECREF(self->append);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *DeliverPath_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *ct, *cst, *at, *it, *ist, *ht, *dt, *hooks;
    static char *kwlist[] = {"channel_type", "channel_stats_type", "attachment_type",
                             "inbox_type", "inbox_stats_type", "histogram_type",
                             "deque_type", "hooks", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOO:DeliverPath", kwlist, &ct, &cst,
                                     &at, &it, &ist, &ht, &dt, &hooks))
        return NULL;
    if (!PyList_CheckExact(hooks)) {
        PyErr_SetString(PyExc_TypeError, "DeliverPath: hooks must be a list");
        return NULL;
    }
    DeliverPathObject *self = (DeliverPathObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject **refs[] = {&self->channel_type, &self->channel_stats_type,
                         &self->attachment_type, &self->inbox_type, &self->inbox_stats_type,
                         &self->histogram_type, &self->deque_type, &self->hooks};
    PyObject *values[] = {ct, cst, at, it, ist, ht, dt, hooks};
    for (size_t i = 0; i < 8; i++) {
        Py_INCREF(values[i]);
        *refs[i] = values[i];
    }
    self->append = PyObject_GetAttrString(dt, "append");
    if (self->append == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    SlotSpec slots[] = {
        {&self->c_encoded, ct, "_encoded"},
        {&self->c_body, ct, "_body"},
        {&self->c_stats, ct, "stats"},
        {&self->c_attachments, ct, "_attachments"},
        {&self->c_last_seq, ct, "_last_seq"},
        {&self->c_lossless, ct, "_lossless"},
        {&self->c_pending, ct, "_pending"},
        {&self->c_released_count, ct, "_released_count"},
        {&self->c_latency, ct, "latency"},
        {&self->cs_upstream, cst, "upstream_drops"},
        {&self->cs_messages, cst, "messages"},
        {&self->cs_deliveries, cst, "deliveries"},
        {&self->a_inbox, at, "inbox"},
        {&self->a_encoded, at, "encoded"},
        {&self->i_closed, it, "_closed"},
        {&self->i_callback, it, "_callback"},
        {&self->i_waiter, it, "_waiter"},
        {&self->i_maxlen, it, "maxlen"},
        {&self->i_items, it, "_items"},
        {&self->i_stats, it, "stats"},
        {&self->is_received, ist, "received"},
        {&self->h_buckets, ht, "buckets"},
        {&self->h_total, ht, "total"},
    };
    if (fill_slots(slots, sizeof slots / sizeof slots[0]) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *DeliverPath_deliver(DeliverPathObject *self, PyObject *const *args,
                                     Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "deliver(channel, seq, message, upstream_drops, sent_ns, body)");
        return NULL;
    }
    PyObject *channel = args[0], *seq_obj = args[1], *message = args[2], *body = args[5];
    long long seq, upstream, sent_ns;
    if (!Py_IS_TYPE(channel, (PyTypeObject *)self->channel_type) || !exact_ll(seq_obj, &seq) ||
        !exact_ll(args[3], &upstream) || !exact_ll(args[4], &sent_ns) ||
        PyList_GET_SIZE(self->hooks) != 0)
        Py_RETURN_FALSE;
    long long encoded, lossless, upstream_drops, messages, deliveries, released = 0;
    PyObject *stats = SLOT(channel, self->c_stats);
    PyObject *attachments = SLOT(channel, self->c_attachments);
    PyObject *pending = SLOT(channel, self->c_pending);
    /* (encoded inboxes take the body: a bytes one only, as the link hands a small
     * message's; the channel's own _body is the general path's) */
    if (!GET_LL(channel, self->c_encoded, encoded) ||
        (encoded != 0 && (!PyBytes_CheckExact(body) || SLOT(channel, self->c_body) != Py_None)) ||
        !GET_LL(channel, self->c_lossless, lossless) || stats == NULL ||
        !Py_IS_TYPE(stats, (PyTypeObject *)self->channel_stats_type) ||
        !GET_LL(stats, self->cs_upstream, upstream_drops) || upstream > upstream_drops ||
        !GET_LL(stats, self->cs_messages, messages) ||
        !GET_LL(stats, self->cs_deliveries, deliveries) || attachments == NULL ||
        !PyTuple_CheckExact(attachments) || pending == NULL ||
        (PyObject *)Py_TYPE(pending) != self->deque_type ||
        (!lossless && !GET_LL(channel, self->c_released_count, released)))
        Py_RETURN_FALSE;
    /* (a tuple: attach and detach replace it, so it is ours for the whole call) */
    Py_INCREF(attachments);
    Py_ssize_t n = PyTuple_GET_SIZE(attachments);
    PyObject *result = Py_False;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *attachment = PyTuple_GET_ITEM(attachments, i);
        if (!Py_IS_TYPE(attachment, (PyTypeObject *)self->attachment_type)) goto done;
        PyObject *inbox = SLOT(attachment, self->a_inbox);
        if (inbox == NULL || !Py_IS_TYPE(inbox, (PyTypeObject *)self->inbox_type)) goto done;
    }
    /* the latency sample: the clock read and the bucket checked before any change */
    PyObject *latency = NULL, *buckets = NULL;
    Py_ssize_t bucket = -1;
    long long total = 0, latency_ns = 0;
    if (sent_ns) {
        latency_ns = wall_ns() - sent_ns;
        latency = SLOT(channel, self->c_latency);
        if (latency == NULL || !Py_IS_TYPE(latency, (PyTypeObject *)self->histogram_type))
            goto done;
        buckets = SLOT(latency, self->h_buckets);
        bucket = latency_ns > 0 ? bit_length((unsigned long long)latency_ns) : 0;
        if (buckets == NULL || !PyList_CheckExact(buckets) ||
            bucket >= PyList_GET_SIZE(buckets) ||
            !PyLong_CheckExact(PyList_GET_ITEM(buckets, bucket)) ||
            (latency_ns > 0 && !GET_LL(latency, self->h_total, total)))
            goto done;
    }

    /* From here on the message is delivered: nothing declines. */
    if (set_ll(channel, self->c_last_seq, seq) < 0) goto fail;
    PyObject *r;
    if (lossless) {
        Py_INCREF(pending); /* (held: an allocation may run a finalizer's Python code) */
        PyObject *entry = Py_BuildValue("[LLi]", seq, lossless, 0);
        if (entry == NULL) {
            Py_DECREF(pending);
            goto fail;
        }
        PyObject *cargs[2] = {pending, entry};
        r = PyObject_Vectorcall(self->append, cargs, 2, NULL);
        Py_DECREF(entry);
        Py_DECREF(pending);
        if (r == NULL) goto fail;
        Py_DECREF(r);
    } else if (set_ll(channel, self->c_released_count, released + 1) < 0) {
        goto fail;
    }
    /* Inbox.put's work, inbox by inbox: a queue's append here, anything else by put
     * itself. A callback or a wake runs Python code (a publish, a detach, a close), so
     * every inbox is looked at when its turn comes and the counters are read after the
     * loop, as the general path does; the attachments are the ones taken at the start,
     * as there. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *attachment = PyTuple_GET_ITEM(attachments, i);
        PyObject *inbox = SLOT(attachment, self->a_inbox);
        /* (what put_encoded hands this inbox: the body, or the message) */
        PyObject *given = encoded != 0 && SLOT(attachment, self->a_encoded) == Py_True ? body
                                                                                       : message;
        int open = SLOT(inbox, self->i_closed) == Py_False;
        PyObject *callback = SLOT(inbox, self->i_callback);
        int calls = callback != NULL && callback != Py_None;
        PyObject *istats = SLOT(inbox, self->i_stats);
        PyObject *items = SLOT(inbox, self->i_items);
        PyObject *maxlen = SLOT(inbox, self->i_maxlen);
        long long received, limit;
        if (calls || !open || SLOT(inbox, self->i_waiter) != Py_None || items == NULL ||
            (PyObject *)Py_TYPE(items) != self->deque_type || maxlen == NULL ||
            (maxlen != Py_None && (!exact_ll(maxlen, &limit) || Py_SIZE(items) >= limit)) ||
            istats == NULL || !Py_IS_TYPE(istats, (PyTypeObject *)self->inbox_stats_type) ||
            !GET_LL(istats, self->is_received, received)) {
            /* (a callback, a waiting task, a full or closed inbox: Inbox.put's business;
             * an open inbox's callback called as put would call it) */
            r = PyObject_CallMethodObjArgs(inbox, calls && open ? str_call : str_put,
                                           attachment, seq_obj, given, NULL);
            if (r == NULL) goto fail;
            Py_DECREF(r);
            continue;
        }
        /* (held: the item's allocation may run a finalizer's Python code) */
        Py_INCREF(items);
        Py_INCREF(istats);
        PyObject *item = PyTuple_Pack(3, attachment, seq_obj, given);
        r = NULL;
        if (item != NULL) {
            PyObject *cargs[2] = {items, item};
            r = PyObject_Vectorcall(self->append, cargs, 2, NULL);
            Py_DECREF(item);
        }
        int failed = r == NULL || set_ll(istats, self->is_received, received + 1) < 0;
        Py_XDECREF(r);
        Py_DECREF(items);
        Py_DECREF(istats);
        if (failed) goto fail;
    }
    stats = SLOT(channel, self->c_stats);
    if (stats == NULL || !Py_IS_TYPE(stats, (PyTypeObject *)self->channel_stats_type) ||
        !GET_LL(stats, self->cs_messages, messages) ||
        !GET_LL(stats, self->cs_deliveries, deliveries)) {
        PyErr_SetString(PyExc_RuntimeError, "deliver: the channel's statistics changed");
        goto fail;
    }
    if (set_ll(stats, self->cs_messages, messages + 1) < 0 ||
        set_ll(stats, self->cs_deliveries, deliveries + n) < 0)
        goto fail;
    if (sent_ns) {
        latency = SLOT(channel, self->c_latency);
        if (latency == NULL || !Py_IS_TYPE(latency, (PyTypeObject *)self->histogram_type) ||
            (latency_ns > 0 && !GET_LL(latency, self->h_total, total))) {
            PyErr_SetString(PyExc_RuntimeError, "deliver: the latency histogram changed");
            goto fail;
        }
        if (add_to_bucket(SLOT(latency, self->h_buckets), bucket, "deliver") < 0 ||
            (latency_ns > 0 && set_ll(latency, self->h_total, total + latency_ns) < 0))
            goto fail;
    }
    /* (read again: a callback may have detached the lossless inboxes, or attached one) */
    if (!GET_LL(channel, self->c_lossless, lossless)) {
        PyErr_SetString(PyExc_RuntimeError, "deliver: the channel's mode changed");
        goto fail;
    }
    if (!lossless) {
        r = PyObject_CallMethodNoArgs(channel, str_notify_release);
        if (r == NULL) goto fail;
        Py_DECREF(r);
    }
    result = Py_True;
done:
    Py_DECREF(attachments);
    return Py_NewRef(result);
fail:
    Py_DECREF(attachments);
    return NULL;
}

static PyMethodDef DeliverPath_methods[] = {
    {"deliver", (PyCFunction)(void (*)(void))DeliverPath_deliver, METH_FASTCALL,
     "deliver(channel, seq, message, upstream_drops, sent_ns, body) -> bool: deliver_local_py's "
     "compiled twin (True: delivered; False: nothing done, Channel.deliver decides)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DeliverPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ezflow._core._speedups.DeliverPath",
    .tp_basicsize = sizeof(DeliverPathObject),
    .tp_dealloc = (destructor)DeliverPath_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled delivery of a local message (deliver_local_py's twin).",
    .tp_methods = DeliverPath_methods,
    .tp_new = DeliverPath_new,
};

static PyMethodDef module_methods[] = {
    {"run_frames", (PyCFunction)(void (*)(void))run_frames, METH_FASTCALL,
     "run_frames(frames, index, size, decode, upstream, lossless, pending_append, appends, "
     "buckets, now_ns, mask, progress, clock, decode_buckets) -> (index, latency total, "
     "decode total): the loop of Channel.deliver_run, as _channel_run.run_frames_py runs "
     "it."},
    {"small_frames", (PyCFunction)(void (*)(void))small_frames, METH_FASTCALL,
     "small_frames(data, start, end, max_frame_size, slice_below) -> list: the whole "
     "small DATA frames at the front of data[start:end], as _small_frames_py gives them."},
    {NULL, NULL, 0, NULL},
};

static int add_copy_functions(PyObject *module); /* (copy_into, at the end) */
static int add_switch_functions(PyObject *module); /* (voluntary_switches, at the end) */

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ezflow._core._speedups",
    .m_doc = "Compiled twins of ezflow's codec hot paths (optional; see _compiled.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    str_dtype = PyUnicode_InternFromString("dtype");
    str_shape = PyUnicode_InternFromString("shape");
    str_nbytes = PyUnicode_InternFromString("nbytes");
    str_tobytes = PyUnicode_InternFromString("tobytes");
    str_flush = PyUnicode_InternFromString("flush");
    str_out_of_line_above = PyUnicode_InternFromString("out_of_line_above");
    str_out = PyUnicode_InternFromString("out");
    str_is_closing = PyUnicode_InternFromString("is_closing");
    str_write = PyUnicode_InternFromString("write");
    str_hand_off = PyUnicode_InternFromString("_hand_off");
    str_g_switches = PyUnicode_InternFromString("_voluntary_switches");
    str_g_yield = PyUnicode_InternFromString("_sched_yield");
    str_g_clock = PyUnicode_InternFromString("time_ns");
    str_g_gap = PyUnicode_InternFromString("PACED_GAP_NS");
    str_init = PyUnicode_InternFromString("__init__");
    str_new = PyUnicode_InternFromString("__new__");
    str_setattr = PyUnicode_InternFromString("__setattr__");
    str_notify_release = PyUnicode_InternFromString("_notify_release");
    str_call = PyUnicode_InternFromString("_call");
    str_body = PyUnicode_InternFromString("_body");
    str_deliver = PyUnicode_InternFromString("deliver");
    str_encoded = PyUnicode_InternFromString("_encoded");
    str_put = PyUnicode_InternFromString("put");
    if (!str_notify_release || !str_call || !str_put || !str_body || !str_deliver || !str_encoded || !str_dtype || !str_shape || !str_nbytes || !str_tobytes || !str_flush ||
        !str_out_of_line_above || !str_init || !str_new || !str_setattr)
        return NULL;
    if (PyType_Ready(&TemplateType) < 0 || PyType_Ready(&LayoutType) < 0 ||
        PyType_Ready(&PublishPathType) < 0 || PyType_Ready(&TakePathType) < 0 ||
        PyType_Ready(&DeliverPathType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) return NULL;
    if (add_copy_functions(m) < 0 || add_switch_functions(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "TEMPLATE_MAX_ITEMS", TEMPLATE_MAX_ITEMS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&TemplateType);
    if (PyModule_AddObject(m, "Template", (PyObject *)&TemplateType) < 0) {
        Py_DECREF(&TemplateType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&LayoutType);
    if (PyModule_AddObject(m, "Layout", (PyObject *)&LayoutType) < 0) {
        Py_DECREF(&LayoutType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PublishPathType);
    if (PyModule_AddObject(m, "PublishPath", (PyObject *)&PublishPathType) < 0) {
        Py_DECREF(&PublishPathType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&TakePathType);
    if (PyModule_AddObject(m, "TakePath", (PyObject *)&TakePathType) < 0) {
        Py_DECREF(&TakePathType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DeliverPathType);
    if (PyModule_AddObject(m, "DeliverPath", (PyObject *)&DeliverPathType) < 0) {
        Py_DECREF(&DeliverPathType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* -- copy_into: the shm publisher's copy of a large message part (issue 28) ------------
 *
 * copy_into(dst, offset, src, nontemporal, threads=1)
 *   Copies the bytes of the C-contiguous buffer src into the writable C-contiguous
 *   buffer dst at offset, with the GIL released; the twin of
 *   ezflow._core._compiled.copy_into_py (same result, same errors: TypeError for a
 *   source that is not a C-contiguous buffer or a destination that is not a writable
 *   one, ValueError for a span outside dst or threads below 1). With nontemporal true,
 *   on x86-64, the stores bypass the cache (SSE2 streaming stores): a part much larger
 *   than the core's cache written for another process to read gains nothing from being
 *   cached here, and a cached store first reads every line it writes (24.9 MB on the
 *   reference machine: 2.8 ms -> 1.9 ms). Elsewhere, or for overlapping buffers, it is
 *   memmove. With threads above 1 (and buffers apart), the copy is cut into that many
 *   pieces of whole cache lines, at least EZ_COPY_PIECE bytes each: the calling thread
 *   copies the first, a helper thread each other one (made for this copy, all signals
 *   blocked, joined before it returns: one core's copy is bounded by what one core can
 *   move, not by the memory). A helper that cannot be made leaves its piece to the
 *   calling thread: the same bytes, later.
 */
#ifndef _WIN32
#include <pthread.h>
#include <signal.h>
#define EZ_COPY_THREADS 1
#endif
#define EZ_COPY_PIECE ((size_t)1 << 20)
#define EZ_COPY_MAX_THREADS 16
#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define EZ_STREAMING_STORES 1
#endif

static void copy_streaming(char *dst, const char *src, size_t n) {
#ifdef EZ_STREAMING_STORES
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence(); /* the streamed lines are visible before anything published after */
    memcpy(dst + i, src + i, n - i);
#else
    memmove(dst, src, n);
#endif
}

typedef struct {
    char *to;
    const char *from;
    size_t n;
    int streaming;
} copy_piece;

static void copy_piece_run(const copy_piece *piece) {
    if (piece->streaming)
        copy_streaming(piece->to, piece->from, piece->n);
    else
        memcpy(piece->to, piece->from, piece->n);
}

#ifdef EZ_COPY_THREADS
static void *copy_piece_thread(void *arg) {
    copy_piece_run((const copy_piece *)arg);
    return NULL;
}
#endif

/* to and from apart; called without the GIL. */
static void copy_split(char *to, const char *from, size_t n, int streaming, Py_ssize_t threads) {
    size_t count = (size_t)threads;
    if (count > EZ_COPY_MAX_THREADS) count = EZ_COPY_MAX_THREADS;
    if (count > n / EZ_COPY_PIECE) count = n / EZ_COPY_PIECE;
    if (count < 2) {
        copy_piece whole = {to, from, n, streaming};
        copy_piece_run(&whole);
        return;
    }
#ifdef EZ_COPY_THREADS
    copy_piece pieces[EZ_COPY_MAX_THREADS];
    pthread_t helpers[EZ_COPY_MAX_THREADS];
    int made[EZ_COPY_MAX_THREADS] = {0};
    size_t step = (n / count) & ~(size_t)63, at = 0;
    for (size_t i = 0; i < count; i++) {
        size_t size = i + 1 == count ? n - at : step;
        pieces[i] = (copy_piece){to + at, from + at, size, streaming};
        at += size;
    }
    /* Helpers block every signal: the process's handlers run in its own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (size_t i = 1; i < count; i++)
        made[i] = pthread_create(&helpers[i], NULL, copy_piece_thread, &pieces[i]) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    copy_piece_run(&pieces[0]);
    for (size_t i = 1; i < count; i++) {
        if (made[i])
            pthread_join(helpers[i], NULL);
        else
            copy_piece_run(&pieces[i]);
    }
#else
    copy_piece whole = {to, from, n, streaming};
    copy_piece_run(&whole);
#endif
}

static PyObject *copy_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "copy_into(dst, offset, src, nontemporal, threads=1)");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    int nontemporal = PyObject_IsTrue(args[3]);
    if (nontemporal < 0) return NULL;
    Py_ssize_t threads = 1;
    if (nargs == 5) {
        threads = PyLong_AsSsize_t(args[4]);
        if (threads == -1 && PyErr_Occurred()) return NULL;
    }
    Py_buffer src, dst;
    if (PyObject_GetBuffer(args[2], &src, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "copy_into: the source is not a contiguous buffer");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "copy_into: the destination is not a writable contiguous buffer");
        return NULL;
    }
    PyObject *result = NULL;
    if (offset < 0 || offset > dst.len || src.len > dst.len - offset) {
        PyErr_Format(PyExc_ValueError, "copy_into: %zd bytes at %zd of a buffer of %zd bytes",
                     src.len, offset, dst.len);
        goto done;
    }
    if (threads < 1) { /* (after the buffers and the span: the twin's order of errors) */
        PyErr_Format(PyExc_ValueError, "copy_into: threads must be 1 or more, not %zd",
                     threads);
        goto done;
    }
    char *to = (char *)dst.buf + offset;
    const char *from = (const char *)src.buf;
    size_t n = (size_t)src.len;
    uintptr_t t = (uintptr_t)to, f = (uintptr_t)from; /* (unrelated buffers: as integers) */
    int apart = t + n <= f || f + n <= t;
    Py_BEGIN_ALLOW_THREADS
    if (apart)
        copy_split(to, from, n, nontemporal, threads);
    else
        memmove(to, from, n);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return result;
}

static PyMethodDef copy_methods[] = {
    {"copy_into", (PyCFunction)(void (*)(void))copy_into, METH_FASTCALL,
     "copy_into(dst, offset, src, nontemporal, threads=1): copy src into dst at offset, "
     "the GIL released (streaming stores when nontemporal, on x86-64; in pieces on up to "
     "threads threads); as copy_into_py does."},
    {NULL, NULL, 0, NULL},
};

static int add_copy_functions(PyObject *module) {
    return PyModule_AddFunctions(module, copy_methods);
}

/* -- voluntary_switches: the paced-publish handoff's test (issue 28) -------------------
 *
 * voluntary_switches()
 *   This thread's voluntary context switches so far, getrusage(RUSAGE_THREAD).ru_nvcsw:
 *   the twin of ezflow._core._compiled.voluntary_switches_py without the 16-field
 *   struct_rusage it builds (with the caches cold after a paced pause, ~6 us of Python
 *   on the path from a paced write to the sched_yield that lets its subscriber run on
 *   this CPU). Linux only (RUSAGE_THREAD): elsewhere the module has no such function.
 */
#include <sys/resource.h>

#ifdef RUSAGE_THREAD
static PyObject *voluntary_switches(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    struct rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(usage.ru_nvcsw);
}

static PyMethodDef switch_methods[] = {
    {"voluntary_switches", (PyCFunction)voluntary_switches, METH_NOARGS,
     "voluntary_switches() -> int: this thread's voluntary context switches so far, as "
     "voluntary_switches_py gives them."},
    {NULL, NULL, 0, NULL},
};
#endif

static int add_switch_functions(PyObject *module) {
#ifdef RUSAGE_THREAD
    return PyModule_AddFunctions(module, switch_methods);
#else
    (void)module;
    return 0;
#endif
}
