/* The recorder's hot path in C: a wrapped torch.distributed collective that writes
 * its call line into the trace's mapping before it calls the collective.
 *
 * Why C: on a small gloo all_reduce the same work in Python (Recorder.record_call)
 * added 11-28% to the call on a 2-vCPU machine: every Python operation there ran
 * several times slower between two collectives than alone. This does what
 * recorder.py's wrapper does for the calls it has seen before and hands every
 * other one to it (the `slow` callable): p2p and the other wrappers it is not made
 * for (recorder.py decides), a framework's deferred call, a tensor dist.reduce left
 * behind (rooted.py). A call it has not seen before gets its fields from Python
 * (Recorder.static_of, which writes the site line); another thread in the middle
 * of a write is waited for in Python (Recorder.write_call); a trace that must grow
 * grows in Python (TraceFile.append_locked).
 *
 * What it writes is byte for byte what Recorder.write_call writes (tests/
 * test_fastcall.py compares them); it shares the recorder's call counter, per-group
 * seq counters, lock and trace file. The fields it reads on every call are in a
 * State struct (hotstate.py), not looked up as attributes: with 13 lookups per call
 * it took 1.1-1.5 us a call alone, 0.7-0.8 us without.
 *
 * A cached call is keyed by a 64-bit hash of what Recorder.static_of's key holds
 * (op, group, async_op, source, phase, each tensor's shape, dtype and device, each
 * frame's code and instruction offset up to the script's outermost frame): the
 * codes stay referenced by the recorder (_pinned_codes), so their addresses are not
 * reused while the cache holds them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define KEY_FRAMES 64 /* recorder.py's _KEY_FRAMES */
/* What hotstate.py checks before it uses this module: raise it with any change to
 * State, FastCall's arguments or the trace line, so that a module built from an
 * older source is not used with newer Python code (an editable install not rebuilt). */
#define FASTCALL_ABI 1

static PyObject *s_training,
    *s_note_phase,
    *s_static_of, *s_append_locked, *s_shape, *s_dtype, *s_is_cpu, *s_device, *s_group, *s_async_op,
    *s_acquire, *s_release, *s_write_call, *s_train, *s_eval;

/* How deep this thread is inside recorded collectives (recorder.py's _Depth): a C
 * thread-local, read here without an attribute lookup. One recorder per process. */
static _Thread_local long inside_depth = 0;

typedef struct {
    PyObject_HEAD
} Depth;

static PyObject *depth_get_inside(PyObject *self, void *closure) { return PyLong_FromLong(inside_depth); }

static int depth_set_inside(PyObject *self, PyObject *value, void *closure) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete inside");
        return -1;
    }
    long depth = PyLong_AsLong(value);
    if (depth == -1 && PyErr_Occurred())
        return -1;
    inside_depth = depth;
    return 0;
}

static PyGetSetDef depth_getset[] = {
    {"inside", depth_get_inside, depth_set_inside, "> 0 while a recorded collective runs on this thread"},
    {NULL},
};

static PyTypeObject DepthType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ncclcheck.record._fastcall.Depth",
    .tp_basicsize = sizeof(Depth),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "recorder.py's _Depth, per thread, in C.",
    .tp_new = PyType_GenericNew,
    .tp_getset = depth_getset,
};

/* What the hot path reads on every call, without an attribute lookup: the recorder
 * and its TraceFile keep these fields here (hotstate.py makes the object; recorder.py
 * and tracefile.py read and set them as attributes). */
typedef struct {
    PyObject_HEAD
    long long calls;       /* call lines written */
    PyObject *position;    /* bytes: ',"pos":{...}' of the loader batch being processed, or b"" */
    PyObject *phase;       /* str: the phase the last phase line told */
    PyObject *deferred;    /* a framework's deferred origin, or None */
    PyObject *mode_module; /* weakref.ref (or a callable) to the module that told the phase */
    int user_no_grad;      /* no_grad/inference_mode blocks of the user's own that are open */
    int in_backward;       /* > 0 inside backward(): grad mode is off there, not for evaluation */
    PyObject *outermost;   /* the bootstrap's frame: the walk over the stack stops there */
    Py_ssize_t end;        /* bytes written to the trace */
    Py_ssize_t capacity;   /* bytes the trace's mapping holds */
    PyObject *map;         /* the trace's mmap.mmap, or None once closed (or in a forked child) */
} State;

static int state_traverse(State *self, visitproc visit, void *arg) {
    Py_VISIT(self->position);
    Py_VISIT(self->phase);
    Py_VISIT(self->deferred);
    Py_VISIT(self->mode_module);
    Py_VISIT(self->outermost);
    Py_VISIT(self->map);
    return 0;
}

static int state_clear(State *self) {
    Py_CLEAR(self->position);
    Py_CLEAR(self->phase);
    Py_CLEAR(self->deferred);
    Py_CLEAR(self->mode_module);
    Py_CLEAR(self->outermost);
    Py_CLEAR(self->map);
    return 0;
}

static void state_dealloc(State *self) {
    PyObject_GC_UnTrack(self);
    state_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef state_members[] = {
    {"calls", T_LONGLONG, offsetof(State, calls), 0, NULL},
    {"position", T_OBJECT, offsetof(State, position), 0, NULL},
    {"phase", T_OBJECT, offsetof(State, phase), 0, NULL},
    {"deferred", T_OBJECT, offsetof(State, deferred), 0, NULL},
    {"mode_module", T_OBJECT, offsetof(State, mode_module), 0, NULL},
    {"user_no_grad", T_INT, offsetof(State, user_no_grad), 0, NULL},
    {"in_backward", T_INT, offsetof(State, in_backward), 0, NULL},
    {"outermost", T_OBJECT, offsetof(State, outermost), 0, NULL},
    {"end", T_PYSSIZET, offsetof(State, end), 0, NULL},
    {"capacity", T_PYSSIZET, offsetof(State, capacity), 0, NULL},
    {"map", T_OBJECT, offsetof(State, map), 0, NULL},
    {NULL},
};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ncclcheck.record._fastcall.State",
    .tp_basicsize = sizeof(State),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The recorder's per-call state, read by the C fast path (see hotstate.py).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)state_dealloc,
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_members = state_members,
};

typedef struct {
    PyObject_HEAD
    PyObject *dict;         /* __dict__: functools.wraps's attributes, __ncclcheck_wrapped__ */
    PyObject *fn;           /* the torch.distributed function */
    PyObject *slow;         /* recorder.py's wrapper, for every call this one does not take */
    PyObject *recorder;
    PyObject *op;           /* "all_reduce" */
    PyObject *source;       /* "python" */
    PyObject *depth;        /* the recorder's _Depth (threading.local) */
    PyObject *rooted;       /* the recorder's rooted dict */
    PyObject *acquire;      /* the trace lock's acquire and release, bound */
    PyObject *release;
    PyObject *trace;        /* the TraceFile (its append_locked grows the file) */
    State *state;           /* the recorder's State, which the TraceFile shares */
    PyObject *cache;        /* recorder.fast_static: hash -> (encoded, seq counter) */
    PyObject *tensor_type;  /* torch.Tensor */
    PyObject *grad_enabled; /* torch.is_grad_enabled */
    Py_ssize_t group_index; /* position of `group` in the signature, or -1 */
    Py_ssize_t async_index; /* position of `async_op`, or -1 */
    vectorcallfunc vectorcall;
} FastCall;

static inline uint64_t mix(uint64_t h, uint64_t v) {
    /* splitmix64 of the running hash and the value */
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

/* 1: hashed; 0: not a tensor; -1: error */
static int mix_tensor(FastCall *self, PyObject *value, uint64_t *h) {
    int is_tensor = PyObject_IsInstance(value, self->tensor_type);
    if (is_tensor <= 0)
        return is_tensor;
    PyObject *shape = PyObject_GetAttr(value, s_shape);
    if (shape == NULL)
        return -1;
    if (!PyTuple_Check(shape)) {
        Py_DECREF(shape);
        PyErr_SetString(PyExc_TypeError, "shape is not a tuple");
        return -1;
    }
    Py_ssize_t dims = PyTuple_GET_SIZE(shape);
    *h = mix(*h, 0x5348415045ULL + (uint64_t)dims);
    for (Py_ssize_t i = 0; i < dims; i++) {
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (size == -1 && PyErr_Occurred()) {
            Py_DECREF(shape);
            return -1;
        }
        *h = mix(*h, (uint64_t)size);
    }
    Py_DECREF(shape);
    PyObject *dtype = PyObject_GetAttr(value, s_dtype);
    if (dtype == NULL)
        return -1;
    *h = mix(*h, (uint64_t)(uintptr_t)dtype); /* torch.dtype objects are singletons */
    Py_DECREF(dtype);
    PyObject *on_cpu = PyObject_GetAttr(value, s_is_cpu); /* a bool, where get_device() parses arguments */
    if (on_cpu == NULL)
        return -1;
    Py_DECREF(on_cpu);
    if (on_cpu == Py_True) {
        *h = mix(*h, 1);
        return 1;
    }
    PyObject *device = PyObject_GetAttr(value, s_device);
    if (device == NULL)
        return -1;
    Py_hash_t device_hash = PyObject_Hash(device); /* torch.device hashes its type and index */
    Py_DECREF(device);
    if (device_hash == -1)
        return -1;
    *h = mix(*h, (uint64_t)device_hash);
    return 1;
}

/* The tensors of a call's arguments, as recorder.py's _tensor_key reads them: the
 * arguments and the items of lists and tuples among them (a superset is safe: it
 * only splits the cache). 0 or -1. */
static int mix_tensors(FastCall *self, PyObject *const *items, Py_ssize_t count, uint64_t *h, int level) {
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = items[i];
        int done = mix_tensor(self, value, h);
        if (done < 0)
            return -1;
        if (done == 0 && level < 2 && (PyList_Check(value) || PyTuple_Check(value))) {
            *h = mix(*h, 0x4c495354ULL + (uint64_t)level);
            if (mix_tensors(self, PySequence_Fast_ITEMS(value), PySequence_Fast_GET_SIZE(value), h, level + 1) <
                0)
                return -1;
            *h = mix(*h, 0x454e44ULL);
        }
    }
    return 0;
}

/* recorder.phase: "eval" when the module told last is not training, or when the
 * user's own no_grad is open outside backward. New reference or NULL. */
static PyObject *current_phase(FastCall *self) {
    State *state = self->state;
    PyObject *ref = state->mode_module;
    PyObject *module;
    if (ref == NULL || ref == Py_None) {
        module = Py_None;
        Py_INCREF(module);
    } else if (PyWeakref_CheckRef(ref)) {
        module = PyWeakref_GetObject(ref); /* borrowed; Py_None once dead */
        Py_INCREF(module);
    } else {
        module = PyObject_CallNoArgs(ref);
        if (module == NULL)
            return NULL;
    }
    int eval = 0;
    if (module != Py_None) {
        PyObject *training = PyObject_GetAttr(module, s_training);
        Py_DECREF(module);
        if (training == NULL)
            return NULL;
        int on = PyObject_IsTrue(training);
        Py_DECREF(training);
        if (on < 0)
            return NULL;
        eval = !on;
    } else {
        Py_DECREF(module);
    }
    if (!eval && state->user_no_grad > 0) {
        PyObject *enabled = PyObject_CallNoArgs(self->grad_enabled);
        if (enabled == NULL)
            return NULL;
        int grad = PyObject_IsTrue(enabled);
        Py_DECREF(enabled);
        if (grad < 0)
            return NULL;
        eval = !grad && !state->in_backward;
    }
    PyObject *phase = eval ? s_eval : s_train;
    Py_INCREF(phase);
    return phase;
}

static PyObject *call_slow(FastCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

/* snprintf's "%lld" cost more than the rest of the line */
static int put_number(char *out, int at, long long value) {
    char digits[24];
    int count = 0;
    unsigned long long rest = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        digits[count++] = (char)('0' + rest % 10);
        rest /= 10;
    } while (rest);
    if (value < 0)
        out[at++] = '-';
    while (count)
        out[at++] = digits[--count];
    return at;
}

static int put_text(char *out, int at, const char *text) {
    size_t length = strlen(text);
    memcpy(out + at, text, length);
    return at + (int)length;
}

/* head + position + fields + "}\n": the call line, as Recorder.write_call formats it */
static void copy_line(char *out, const char *head, int head_len, PyObject *position, PyObject *fields) {
    Py_ssize_t position_len = PyBytes_GET_SIZE(position), fields_len = PyBytes_GET_SIZE(fields);
    memcpy(out, head, head_len);
    memcpy(out + head_len, PyBytes_AS_STRING(position), position_len);
    memcpy(out + head_len + position_len, PyBytes_AS_STRING(fields), fields_len);
    memcpy(out + head_len + position_len + fields_len, "}\n", 2);
}

/* Store the call line in the trace's mapping; the lock is held. 0, 1 (the trace
 * must grow: done through TraceFile.append_locked) or -1. */
static int store_line(FastCall *self, PyObject *encoded) {
    State *state = self->state;
    PyObject *counter = PyTuple_GET_ITEM(encoded, 1);
    PyObject *seq_obj = PyIter_Next(counter);
    if (seq_obj == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "seq counter ended");
        return -1;
    }
    long long seq = PyLong_AsLongLong(seq_obj);
    Py_DECREF(seq_obj);
    if (seq == -1 && PyErr_Occurred())
        return -1;
    PyObject *position = state->position, *fields = PyTuple_GET_ITEM(encoded, 0);
    if (position == NULL || !PyBytes_Check(position) || !PyBytes_Check(fields)) {
        PyErr_SetString(PyExc_TypeError, "call fields are not bytes");
        return -1;
    }
    long long calls = ++state->calls;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now); /* time.time_ns()'s clock */
    long long ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    char head[96];
    int head_len = 0;
    head_len = put_text(head, head_len, "{\"t\":\"call\",\"n\":");
    head_len = put_number(head, head_len, calls);
    head_len = put_text(head, head_len, ",\"seq\":");
    head_len = put_number(head, head_len, seq);
    head_len = put_text(head, head_len, ",\"ns\":");
    head_len = put_number(head, head_len, ns);
    Py_ssize_t total = head_len + PyBytes_GET_SIZE(position) + PyBytes_GET_SIZE(fields) + 2;
    PyObject *mapped = state->map;
    if (mapped == NULL || mapped == Py_None) /* closed, or a forked child: as TraceFile.append_locked */
        return 0;
    if (state->end + total > state->capacity) { /* rare: the line, assembled, through Python's grow */
        PyObject *line = PyBytes_FromStringAndSize(NULL, total);
        if (line == NULL)
            return -1;
        copy_line(PyBytes_AS_STRING(line), head, head_len, position, fields);
        PyObject *appended = PyObject_CallMethodOneArg(self->trace, s_append_locked, line);
        Py_DECREF(line);
        if (appended == NULL)
            return -1;
        Py_DECREF(appended);
        return 0;
    }
    Py_buffer view; /* taken per call: a buffer held on would stop the mapping's resize */
    if (PyObject_GetBuffer(mapped, &view, PyBUF_WRITABLE) < 0)
        return -1;
    if (view.len < state->end + total) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "trace mapping smaller than its capacity");
        return -1;
    }
    copy_line((char *)view.buf + state->end, head, head_len, position, fields);
    PyBuffer_Release(&view);
    state->end += total;
    return 0;
}

static PyObject *fastcall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    FastCall *self = (FastCall *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);

    if (inside_depth) /* a collective inside a collective: the outer one is recorded */
        return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    if (PyDict_GET_SIZE(self->rooted) > 0)
        return call_slow(self, args, nargsf, kwnames);
    if (self->state->deferred != NULL && self->state->deferred != Py_None)
        return call_slow(self, args, nargsf, kwnames); /* a framework's deferred call: its origin */

    /* group, async_op and the tensors, as recorder.py's wrapper reads them */
    PyObject *group = Py_None;
    int async_op = 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_Compare(name, s_group) == 0) {
            group = args[nargs + i];
        } else if (PyUnicode_Compare(name, s_async_op) == 0) {
            async_op = PyObject_IsTrue(args[nargs + i]);
            if (async_op < 0)
                return NULL;
        } /* any other keyword's value counts among the tensors, as in recorder.py */
    }
    if (group == Py_None && self->group_index >= 0 && nargs > self->group_index)
        group = args[self->group_index];
    if (self->async_index >= 0 && nargs > self->async_index) {
        async_op = PyObject_IsTrue(args[self->async_index]);
        if (async_op < 0)
            return NULL;
    }
    PyObject *tensors = NULL; /* (*args, *kwargs.values()), made for a call not seen before */
    PyObject *result = NULL, *phase = NULL, *key = NULL, *outermost;
    phase = current_phase(self);
    if (phase == NULL)
        goto done;
    PyObject *told = self->state->phase;
    if (told == NULL || !PyUnicode_Check(told) || PyUnicode_Compare(told, phase) != 0) { /* a phase line, as Recorder._note_phase writes it */
        PyObject *noted = PyObject_CallMethodNoArgs(self->recorder, s_note_phase);
        if (noted == NULL)
            goto done;
        Py_DECREF(noted);
    }

    uint64_t h = 0x6e63636c636865ULL;
    h = mix(h, (uint64_t)(uintptr_t)self->op);
    h = mix(h, (uint64_t)(uintptr_t)group);
    h = mix(h, (uint64_t)async_op);
    h = mix(h, (uint64_t)(uintptr_t)self->source);
    h = mix(h, phase == s_eval ? 2 : 1);
    if (mix_tensors(self, args, nargs + nkw, &h, 0) < 0)
        goto done;
    outermost = self->state->outermost;
    PyFrameObject *caller = PyEval_GetFrame(); /* borrowed: the frame that called us */
    PyFrameObject *frame = caller;
    Py_XINCREF(frame);
    for (int depth = 0; frame != NULL && (PyObject *)frame != outermost && depth < KEY_FRAMES; depth++) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        h = mix(h, (uint64_t)(uintptr_t)code);
        Py_DECREF(code);
#if PY_VERSION_HEX >= 0x030B0000
        h = mix(h, (uint64_t)PyFrame_GetLasti(frame));
#else
        h = mix(h, (uint64_t)frame->f_lasti);
#endif
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    key = PyLong_FromUnsignedLongLong(h);
    if (key == NULL)
        goto done;
    PyObject *encoded = PyDict_GetItemWithError(self->cache, key); /* borrowed */
    if (encoded == NULL) {
        if (PyErr_Occurred())
            goto done;
        tensors = PyTuple_New(nargs + nkw);
        if (tensors == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(tensors, i, args[i]);
        }
        /* Recorder.static_of(op, group, tensors, async_op, source, caller) */
        PyObject *call_args[] = {self->recorder, self->op,    group, tensors, async_op ? Py_True : Py_False,
                                 self->source,   caller != NULL ? (PyObject *)caller : Py_None};
        PyObject *made = PyObject_VectorcallMethod(s_static_of, call_args, 7, NULL);
        if (made == NULL)
            goto done;
        if (!PyTuple_Check(made) || PyTuple_GET_SIZE(made) != 2) {
            Py_DECREF(made);
            PyErr_SetString(PyExc_TypeError, "static_of must return (bytes, counter)");
            goto done;
        }
        if (PyDict_SetItem(self->cache, key, made) < 0) {
            Py_DECREF(made);
            goto done;
        }
        Py_DECREF(made);
        encoded = PyDict_GetItemWithError(self->cache, key);
        if (encoded == NULL)
            goto done;
    }
    Py_INCREF(encoded);
    /* the line, under the recorder's lock; another thread holding it: wait in Python */
    PyObject *got = PyObject_CallOneArg(self->acquire, Py_False);
    if (got == NULL) {
        Py_DECREF(encoded);
        goto done;
    }
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked) {
        PyObject *written = PyObject_CallMethodOneArg(self->recorder, s_write_call, encoded);
        Py_DECREF(encoded);
        if (written == NULL)
            goto done;
        Py_DECREF(written);
    } else {
        int stored = store_line(self, encoded);
        Py_DECREF(encoded);
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *released = PyObject_CallNoArgs(self->release);
        Py_XDECREF(released);
        if (released == NULL) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            goto done;
        }
        PyErr_Restore(type, value, traceback);
        if (stored < 0)
            goto done;
    }

    inside_depth = 1;
    result = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    inside_depth = 0;
done:
    Py_XDECREF(tensors);
    Py_XDECREF(phase);
    Py_XDECREF(key);
    return result;
}

static int fastcall_init(FastCall *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"fn",    "slow",  "recorder",    "op",           "source",      "depth",
                            "rooted", "lock", "trace",      "state",        "cache",       "tensor_type",
                            "grad_enabled", "group_index", "async_index", NULL};
    PyObject *fn, *slow, *recorder, *op, *source, *depth, *rooted, *lock, *trace, *state, *cache, *tensor_type,
        *grad_enabled;
    Py_ssize_t group_index, async_index;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOUUOO!OOO!O!OOnn", names, &fn, &slow, &recorder, &op,
                                     &source, &depth, &PyDict_Type, &rooted, &lock, &trace, &StateType, &state,
                                     &PyDict_Type, &cache, &tensor_type, &grad_enabled, &group_index,
                                     &async_index))
        return -1;
    Py_INCREF(state);
    Py_XSETREF(self->state, (State *)state);
    PyObject **slots[] = {&self->fn,    &self->slow,  &self->recorder, &self->op,
                          &self->source, &self->depth, &self->rooted,   &self->trace,
                          &self->cache,  &self->tensor_type, &self->grad_enabled};
    PyObject *values[] = {fn, slow, recorder, op, source, depth, rooted, trace, cache, tensor_type, grad_enabled};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    Py_XSETREF(self->acquire, PyObject_GetAttr(lock, s_acquire));
    Py_XSETREF(self->release, PyObject_GetAttr(lock, s_release));
    if (self->acquire == NULL || self->release == NULL)
        return -1;
    if (!PyObject_TypeCheck(depth, &DepthType)) {
        PyErr_SetString(PyExc_TypeError, "depth must be a _fastcall.Depth");
        return -1;
    }
    self->group_index = group_index;
    self->async_index = async_index;
    self->vectorcall = fastcall_vectorcall;
    return 0;
}

static int fastcall_traverse(FastCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->fn);
    Py_VISIT(self->slow);
    Py_VISIT(self->recorder);
    Py_VISIT(self->depth);
    Py_VISIT(self->rooted);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->trace);
    Py_VISIT(self->state);
    Py_VISIT(self->cache);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->grad_enabled);
    return 0;
}

static int fastcall_clear(FastCall *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->fn);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->op);
    Py_CLEAR(self->source);
    Py_CLEAR(self->depth);
    Py_CLEAR(self->rooted);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->trace);
    Py_CLEAR(self->state);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->grad_enabled);
    return 0;
}

static void fastcall_dealloc(FastCall *self) {
    PyObject_GC_UnTrack(self);
    fastcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fastcall_repr(FastCall *self) {
    return PyUnicode_FromFormat("<ncclcheck recorded %U>", self->op);
}

static PyObject *fastcall_get(PyObject *self, PyObject *obj, PyObject *type) {
    /* a function's binding, so that it can stand in for one as a class attribute */
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyGetSetDef fastcall_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ncclcheck.record._fastcall.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A torch.distributed collective that records each call before it runs (see recorder.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)fastcall_init,
    .tp_dealloc = (destructor)fastcall_dealloc,
    .tp_traverse = (traverseproc)fastcall_traverse,
    .tp_clear = (inquiry)fastcall_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_dictoffset = offsetof(FastCall, dict),
    .tp_descr_get = fastcall_get,
    .tp_repr = (reprfunc)fastcall_repr,
    .tp_getset = fastcall_getset,
};

static struct PyModuleDef fastcall_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ncclcheck.record._fastcall",
    .m_doc = "The recorder's hot path in C (optional: recorder.py does the same in Python).",
    .m_size = -1,
};

#define INTERN(var, text)                                                                                  \
    do {                                                                                                   \
        var = PyUnicode_InternFromString(text);                                                            \
        if (var == NULL)                                                                                   \
            return NULL;                                                                                   \
    } while (0)

PyMODINIT_FUNC PyInit__fastcall(void) {
    INTERN(s_training, "training");
    INTERN(s_note_phase, "_note_phase");
    INTERN(s_static_of, "static_of");
    INTERN(s_append_locked, "append_locked");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_is_cpu, "is_cpu");
    INTERN(s_device, "device");
    INTERN(s_group, "group");
    INTERN(s_async_op, "async_op");
    INTERN(s_acquire, "acquire");
    INTERN(s_release, "release");
    INTERN(s_write_call, "write_call");
    INTERN(s_train, "train");
    INTERN(s_eval, "eval");
    if (PyType_Ready(&FastCallType) < 0 || PyType_Ready(&DepthType) < 0 || PyType_Ready(&StateType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&fastcall_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&FastCallType);
    if (PyModule_AddObject(module, "FastCall", (PyObject *)&FastCallType) < 0) {
        Py_DECREF(&FastCallType);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "ABI", FASTCALL_ABI) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&StateType);
    if (PyModule_AddObject(module, "State", (PyObject *)&StateType) < 0) {
        Py_DECREF(&StateType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&DepthType);
    if (PyModule_AddObject(module, "Depth", (PyObject *)&DepthType) < 0) {
        Py_DECREF(&DepthType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
