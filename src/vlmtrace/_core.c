/* vlmtrace._core: the compiled core, built with the wheel (setup.py). It holds the fatal-signal guard
 * (export/fatal_guard.c; export/fatal_guard.py drives it) and the span boundaries' host-memory read
 * (probes/host.py). Every call holds the GIL: each is a system call or a few at most, less than releasing
 * and taking it back would cost (on a span boundary inside a serving engine, taking it back can wait for
 * another thread's switch interval). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <unistd.h>

int vlmtrace_guard_front(int signum);
int vlmtrace_guard_behind_installed(int signum);
int vlmtrace_guard_terminating(int signum, long bound_ms);
int vlmtrace_guard_dying(void);
void vlmtrace_guard_set_bound_ms(long milliseconds);
void *vlmtrace_guard_address(void);

static PyObject *guard_front(PyObject *module, PyObject *arg)
{
    long signum = PyLong_AsLong(arg);
    if (signum == -1 && PyErr_Occurred())
        return NULL;
    if (vlmtrace_guard_front((int)signum) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *guard_behind_installed(PyObject *module, PyObject *arg)
{
    long signum = PyLong_AsLong(arg);
    if (signum == -1 && PyErr_Occurred())
        return NULL;
    vlmtrace_guard_behind_installed((int)signum);
    Py_RETURN_NONE;
}

static PyObject *guard_terminating(PyObject *module, PyObject *args)
{
    int signum;
    long bound_ms;
    if (!PyArg_ParseTuple(args, "il", &signum, &bound_ms))
        return NULL;
    vlmtrace_guard_terminating(signum, bound_ms);
    Py_RETURN_NONE;
}

static PyObject *guard_dying(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(vlmtrace_guard_dying());
}

static PyObject *guard_set_bound_ms(PyObject *module, PyObject *arg)
{
    long milliseconds = PyLong_AsLong(arg);
    if (milliseconds == -1 && PyErr_Occurred())
        return NULL;
    vlmtrace_guard_set_bound_ms(milliseconds);
    Py_RETURN_NONE;
}

static PyObject *guard_address(PyObject *module, PyObject *unused)
{
    return PyLong_FromVoidPtr(vlmtrace_guard_address());
}

/* statm_rss(fd, page_size): resident bytes, from /proc/self/statm open at `fd` (its second field, in pages):
 * one pread and the parse of two numbers, no Python object but the result. */
static PyObject *statm_rss(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    char text[128];
    long fd, page_size;
    ssize_t length;
    unsigned long long pages = 0;
    const char *at;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "statm_rss(fd, page_size)");
        return NULL;
    }
    fd = PyLong_AsLong(args[0]);
    page_size = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    do
        length = pread((int)fd, text, sizeof text - 1, 0);
    while (length < 0 && errno == EINTR);
    if (length < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    text[length] = '\0';
    at = text;
    while (*at >= '0' && *at <= '9') /* the total size */
        at++;
    if (*at != ' ' || at[1] < '0' || at[1] > '9') {
        PyErr_Format(PyExc_OSError, "unexpected /proc/self/statm: %.40s", text);
        return NULL;
    }
    for (at++; *at >= '0' && *at <= '9'; at++)
        pages = pages * 10 + (unsigned long long)(*at - '0');
    return PyLong_FromUnsignedLongLong(pages * (unsigned long long)page_size);
}

static PyMethodDef methods[] = {
    {"statm_rss", (PyCFunction)(void (*)(void))statm_rss, METH_FASTCALL,
     "Resident bytes from /proc/self/statm open at fd: statm_rss(fd, page_size)."},
    {"guard_front", guard_front, METH_O, "Put the guard in front of what is installed now for a signal."},
    {"guard_behind_installed", guard_behind_installed, METH_O,
     "Pass a signal on to what is installed now for it."},
    {"guard_terminating", guard_terminating, METH_VARARGS,
     "Bound a terminating signal's end: (signum, bound_ms)."},
    {"guard_dying", guard_dying, METH_NOARGS, "Whether a fatal signal's chain is running."},
    {"guard_set_bound_ms", guard_set_bound_ms, METH_O, "The longest time a fatal signal's chain may take."},
    {"guard_address", guard_address, METH_NOARGS, "The guard's handler address, as sigaction gives it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "vlmtrace._core", "vlmtrace's compiled core (setup.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModule_Create(&module);
}
