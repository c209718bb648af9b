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

/* The image object of one content item, as instrumentation/inputs.py's images_in_content finds it: a new
 * reference, Py_None where the item names none, NULL on an error. */
static PyObject *item_image(PyObject *item, PyObject *data_key, PyObject *url_key, PyObject *type_key)
{
    PyObject *image = PyDict_GetItemWithError(item, data_key); /* borrowed */
    int truth;
    if (image == NULL && PyErr_Occurred())
        return NULL;
    truth = image != NULL ? PyObject_IsTrue(image) : 0;
    if (truth < 0)
        return NULL;
    if (!truth) {
        PyObject *type = PyDict_GetItemWithError(item, type_key);
        image = type != NULL ? PyDict_GetItemWithError(item, type) : NULL;
        if (image == NULL && PyErr_Occurred())
            return NULL;
    }
    if (image != NULL && PyDict_Check(image)) {
        PyObject *inner = PyDict_GetItemWithError(image, data_key);
        if (inner == NULL && PyErr_Occurred())
            return NULL;
        truth = inner != NULL ? PyObject_IsTrue(inner) : 0;
        if (truth < 0)
            return NULL;
        if (!truth) {
            inner = PyDict_GetItemWithError(image, url_key);
            if (inner == NULL && PyErr_Occurred())
                return NULL;
        }
        image = inner;
    }
    image = image != NULL ? image : Py_None;
    Py_INCREF(image);
    return image;
}

/* An image's (width, height): its `size` where that is a pair of ints; NULL without an error where it is not. */
static PyObject *image_size(PyObject *image, PyObject *size_name)
{
    PyObject *size = PyObject_GetAttr(image, size_name);
    if (size == NULL) {
        PyErr_Clear(); /* getattr(image, "size", None): any failure reads as no size */
        return NULL;
    }
    if (PyTuple_Check(size) && PyTuple_GET_SIZE(size) == 2 && PyLong_Check(PyTuple_GET_ITEM(size, 0))
        && PyLong_Check(PyTuple_GET_ITEM(size, 1)))
        return size;
    Py_DECREF(size);
    return NULL;
}

/* image_sizes(messages): (images, sizes), what instrumentation/inputs.py's images_in_messages and image_sizes
 * give (the count of the images in OpenAI-style messages, and the (width, height) of those that have one),
 * in one call that reads only dicts, lists and each image's `size`. */
static PyObject *image_sizes(PyObject *module, PyObject *messages)
{
    static const char *types[] = {"image", "image_url", "image_data"};
    PyObject *data_key = NULL, *url_key = NULL, *type_key = NULL, *content_key = NULL, *size_name = NULL;
    PyObject *sizes = NULL, *result = NULL;
    Py_ssize_t images = 0;

    sizes = PyList_New(0);
    if (sizes == NULL || !PyList_Check(messages))
        goto done;
    data_key = PyUnicode_InternFromString("data");
    url_key = PyUnicode_InternFromString("url");
    type_key = PyUnicode_InternFromString("type");
    content_key = PyUnicode_InternFromString("content");
    size_name = PyUnicode_InternFromString("size");
    if (!data_key || !url_key || !type_key || !content_key || !size_name)
        goto failed;
    for (Py_ssize_t m = 0; m < PyList_GET_SIZE(messages); m++) {
        PyObject *message = PyList_GET_ITEM(messages, m), *content;
        if (!PyDict_Check(message))
            continue;
        content = PyDict_GetItemWithError(message, content_key);
        if (content == NULL && PyErr_Occurred())
            goto failed;
        if (content == NULL || !PyList_Check(content))
            continue;
        Py_INCREF(content);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(content); i++) {
            PyObject *item = PyList_GET_ITEM(content, i), *type, *image, *size;
            int image_type = 0;
            if (!PyDict_Check(item))
                continue;
            type = PyDict_GetItemWithError(item, type_key);
            if (type == NULL && PyErr_Occurred()) {
                Py_DECREF(content);
                goto failed;
            }
            for (int t = 0; type != NULL && PyUnicode_Check(type) && t < 3 && !image_type; t++)
                image_type = PyUnicode_CompareWithASCIIString(type, types[t]) == 0;
            if (!image_type)
                continue;
            Py_INCREF(item);
            image = item_image(item, data_key, url_key, type_key);
            Py_DECREF(item);
            if (image == NULL) {
                Py_DECREF(content);
                goto failed;
            }
            images++;
            size = image_size(image, size_name);
            Py_DECREF(image);
            if (size != NULL) {
                int appended = PyList_Append(sizes, size);
                Py_DECREF(size);
                if (appended < 0) {
                    Py_DECREF(content);
                    goto failed;
                }
            }
        }
        Py_DECREF(content);
    }
done:
    if (sizes != NULL)
        result = Py_BuildValue("(nO)", images, sizes);
failed:
    Py_XDECREF(sizes);
    Py_XDECREF(data_key);
    Py_XDECREF(url_key);
    Py_XDECREF(type_key);
    Py_XDECREF(content_key);
    Py_XDECREF(size_name);
    return result;
}

static PyMethodDef methods[] = {
    {"image_sizes", image_sizes, METH_O,
     "(images, sizes) of OpenAI-style messages: the images' count and the (width, height) of those with one."},
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
