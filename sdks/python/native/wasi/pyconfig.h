/*
 * pyconfig.h for building sluice._speedups against the stable ABI (Py_LIMITED_API)
 * for the CPython that componentize-py bundles: wasm32-wasi, 32-bit.
 *
 * native/build.sh puts this file in place of the host Python's pyconfig.h
 * in a copy of its headers: the limited API's headers read only the sizes
 * and the handful of feature macros below, and the sizes must be wasm32's,
 * not the host's. The values are those of CPython's own wasm32-wasi build
 * (its _sysconfigdata__wasi_wasm32-wasi.py, as componentize-py 0.25.1 ships it).
 */
#ifndef Py_PYCONFIG_H
#define Py_PYCONFIG_H

#define SIZEOF_DOUBLE 8
#define SIZEOF_FLOAT 4
#define SIZEOF_FPOS_T 16
#define SIZEOF_INT 4
#define SIZEOF_LONG 4
#define SIZEOF_LONG_DOUBLE 16
#define SIZEOF_LONG_LONG 8
#define SIZEOF_OFF_T 8
#define SIZEOF_PID_T 4
#define SIZEOF_PTHREAD_KEY_T 4
#define SIZEOF_PTHREAD_T 4
#define SIZEOF_SHORT 2
#define SIZEOF_SIZE_T 4
#define SIZEOF_TIME_T 8
#define SIZEOF_UINTPTR_T 4
#define SIZEOF_VOID_P 4
#define SIZEOF_WCHAR_T 4
#define SIZEOF__BOOL 1
#define ALIGNOF_LONG 4
#define ALIGNOF_SIZE_T 4

#define STDC_HEADERS 1
#define HAVE_ERRNO_H 1
#define HAVE_STDDEF_H 1
#define HAVE_STDINT_H 1
#define HAVE_STDLIB_H 1
#define HAVE_SYS_STAT_H 1
#define HAVE_SYS_TIME_H 1
#define HAVE_SYS_TYPES_H 1
#define HAVE_UNISTD_H 1
#define HAVE_WCHAR_H 1
#define HAVE_CLOCK_GETTIME 1
#define HAVE_STD_ATOMIC 1
#define HAVE_BUILTIN_ATOMIC 1
#define WITH_DOC_STRINGS 1
#define WITH_PYMALLOC 1

#endif /* Py_PYCONFIG_H */
