// CPython glue for the native engine (deepreduce_hvd._native): argument parsing, buffers,
// the GIL (released around every kernel) and errors. A kernel's dr::Error becomes
// deepreduce_hvd.DeepReduceError, std::bad_alloc becomes MemoryError, anything else a
// RuntimeError: no C++ exception ever crosses into Python or terminates the process.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <functional>
#include <new>
#include <string>

#include "engine.h"

namespace {

PyObject* deepreduce_error = nullptr;

// Releases the GIL, runs fn, and translates whatever it throws. Returns false on error
// (with the Python exception set).
bool run_released(const std::function<void()>& fn) {
    std::string message;
    int kind = 0;  // 0 ok, 1 dr::Error, 2 bad_alloc, 3 other
    Py_BEGIN_ALLOW_THREADS
    try {
        fn();
    } catch (const dr::Error& exc) {
        kind = 1;
        message = exc.what();
    } catch (const std::bad_alloc&) {
        kind = 2;
    } catch (const std::exception& exc) {
        kind = 3;
        message = exc.what();
    } catch (...) {
        kind = 3;
        message = "unknown C++ exception";
    }
    Py_END_ALLOW_THREADS
    if (kind == 1) PyErr_SetString(deepreduce_error, message.c_str());
    if (kind == 2) PyErr_NoMemory();
    if (kind == 3) PyErr_SetString(PyExc_RuntimeError, message.c_str());
    return kind == 0;
}

// A Py_buffer released on scope exit.
struct Buffer {
    Py_buffer view{};
    bool held = false;
    ~Buffer() {
        if (held) PyBuffer_Release(&view);
    }
    bool get(PyObject* obj, bool writable, Py_ssize_t itemsize, const char* what) {
        if (PyObject_GetBuffer(obj, &view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0)
            return false;
        held = true;
        if (view.len % itemsize) {
            PyErr_Format(PyExc_ValueError, "%s: buffer of %zd bytes is not a whole number of "
                         "%zd-byte items", what, view.len, itemsize);
            return false;
        }
        return true;
    }
    template <typename T>
    T* as() const { return static_cast<T*>(view.buf); }
    size_t count(size_t itemsize) const { return static_cast<size_t>(view.len) / itemsize; }
};

template <typename T>
PyObject* to_bytearray(const std::vector<T>& v) {
    return PyByteArray_FromStringAndSize(reinterpret_cast<const char*>(v.data()),
                                         static_cast<Py_ssize_t>(v.size() * sizeof(T)));
}

PyObject* pack_fields(PyObject*, PyObject* args) {
    PyObject *values_obj, *widths_obj;
    if (!PyArg_ParseTuple(args, "OO", &values_obj, &widths_obj)) return nullptr;
    Buffer values, widths;
    if (!values.get(values_obj, false, 8, "values") || !widths.get(widths_obj, false, 8, "widths"))
        return nullptr;
    if (values.count(8) != widths.count(8)) {
        PyErr_SetString(PyExc_ValueError, "pack_fields: values and widths differ in length");
        return nullptr;
    }
    std::vector<uint8_t> out;
    if (!run_released([&] {
            out = dr::pack_fields(values.as<uint64_t>(), widths.as<int64_t>(), values.count(8));
        }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* huffman_pack(PyObject*, PyObject* args) {
    PyObject *symbols_obj, *codes_obj, *lengths_obj, *bits_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &symbols_obj, &codes_obj, &lengths_obj, &bits_obj))
        return nullptr;
    Buffer symbols, codes, lengths, bits;
    if (!symbols.get(symbols_obj, false, 8, "symbols") || !codes.get(codes_obj, false, 8, "codes") ||
        !lengths.get(lengths_obj, false, 1, "lengths") || !bits.get(bits_obj, false, 1, "bits"))
        return nullptr;
    if (codes.count(8) != lengths.count(1)) {
        PyErr_SetString(PyExc_ValueError, "huffman_pack: codes and lengths differ in length");
        return nullptr;
    }
    std::vector<uint8_t> out;
    if (!run_released([&] {
            out = dr::huffman_pack(symbols.as<int64_t>(), symbols.count(8), codes.as<uint64_t>(),
                                   lengths.as<uint8_t>(), lengths.count(1), bits.as<uint8_t>(),
                                   bits.count(1));
        }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* pack_fixed(PyObject*, PyObject* args) {
    PyObject* values_obj;
    int width;
    if (!PyArg_ParseTuple(args, "Oi", &values_obj, &width)) return nullptr;
    Buffer values;
    if (!values.get(values_obj, false, 8, "values")) return nullptr;
    std::vector<uint8_t> out;
    if (!run_released([&] { out = dr::pack_fixed(values.as<uint64_t>(), values.count(8), width); }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* read_fixed(PyObject*, PyObject* args) {
    PyObject* data_obj;
    unsigned long long start, count;
    int width;
    if (!PyArg_ParseTuple(args, "OKKi", &data_obj, &start, &count, &width)) return nullptr;
    Buffer data;
    if (!data.get(data_obj, false, 1, "data")) return nullptr;
    std::vector<uint64_t> out;
    if (!run_released([&] {
            out = dr::read_fixed(data.as<uint8_t>(), data.count(1), start, count, width);
        }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* read_fields(PyObject*, PyObject* args) {
    PyObject *data_obj, *widths_obj;
    unsigned long long start;
    if (!PyArg_ParseTuple(args, "OKO", &data_obj, &start, &widths_obj)) return nullptr;
    Buffer data, widths;
    if (!data.get(data_obj, false, 1, "data") || !widths.get(widths_obj, false, 8, "widths"))
        return nullptr;
    std::vector<uint64_t> out;
    if (!run_released([&] {
            out = dr::read_fields(data.as<uint8_t>(), data.count(1), start,
                                  widths.as<int64_t>(), widths.count(8));
        }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* huffman_decode(PyObject*, PyObject* args) {
    PyObject *data_obj, *lengths_obj;
    unsigned long long start, count;
    if (!PyArg_ParseTuple(args, "OKOK", &data_obj, &start, &lengths_obj, &count)) return nullptr;
    Buffer data, lengths;
    if (!data.get(data_obj, false, 1, "data") || !lengths.get(lengths_obj, false, 1, "lengths"))
        return nullptr;
    std::vector<uint32_t> out;
    uint64_t end = 0;
    if (!run_released([&] {
            out = dr::huffman_decode(data.as<uint8_t>(), data.count(1), start,
                                     lengths.as<uint8_t>(), lengths.count(1), count, &end);
        }))
        return nullptr;
    PyObject* symbols = to_bytearray(out);
    if (!symbols) return nullptr;
    return Py_BuildValue("NK", symbols, static_cast<unsigned long long>(end));
}

PyObject* huffman_lengths(PyObject*, PyObject* args) {
    PyObject* freqs_obj;
    int max_length;
    if (!PyArg_ParseTuple(args, "Oi", &freqs_obj, &max_length)) return nullptr;
    Buffer freqs;
    if (!freqs.get(freqs_obj, false, 8, "freqs")) return nullptr;
    std::vector<uint8_t> out;
    if (!run_released([&] {
            out = dr::huffman_lengths(freqs.as<int64_t>(), freqs.count(8), max_length);
        }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* rice_positions(PyObject*, PyObject* args) {
    PyObject* data_obj;
    unsigned long long start, count;
    long long size;
    int r;
    if (!PyArg_ParseTuple(args, "OKKiL", &data_obj, &start, &count, &r, &size)) return nullptr;
    Buffer data;
    if (!data.get(data_obj, false, 1, "data")) return nullptr;
    std::vector<int64_t> out;
    uint64_t end = 0;
    if (!run_released([&] {
            out = dr::rice_positions(data.as<uint8_t>(), data.count(1), start, count, r, size, &end);
        }))
        return nullptr;
    PyObject* positions = to_bytearray(out);
    if (!positions) return nullptr;
    return Py_BuildValue("NK", positions, static_cast<unsigned long long>(end));
}

PyObject* gap_plan_bytes(PyObject*, PyObject* args) {
    PyObject* hist_obj;
    if (!PyArg_ParseTuple(args, "O", &hist_obj)) return nullptr;
    Buffer hist;
    if (!hist.get(hist_obj, false, 8, "hist")) return nullptr;
    if (hist.count(8) != static_cast<size_t>(dr::kGapLengths) << dr::kGapTop) {
        PyErr_SetString(PyExc_ValueError, "gap_plan_bytes: histogram of the wrong size");
        return nullptr;
    }
    std::vector<int64_t> out;
    if (!run_released([&] { out = dr::gap_plan_bytes(hist.as<int64_t>()); })) return nullptr;
    return to_bytearray(out);
}

PyObject* gap_histogram(PyObject*, PyObject* args) {
    PyObject* gaps_obj;
    if (!PyArg_ParseTuple(args, "O", &gaps_obj)) return nullptr;
    Buffer gaps;
    if (!gaps.get(gaps_obj, false, 8, "gaps")) return nullptr;
    std::vector<int64_t> out;
    if (!run_released([&] { out = dr::gap_histogram(gaps.as<uint64_t>(), gaps.count(8)); }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* gap_pack(PyObject*, PyObject* args) {
    PyObject *gaps_obj, *codes_obj, *lengths_obj;
    int extra;
    if (!PyArg_ParseTuple(args, "OiOO", &gaps_obj, &extra, &codes_obj, &lengths_obj)) return nullptr;
    Buffer gaps, codes, lengths;
    if (!gaps.get(gaps_obj, false, 8, "gaps") || !codes.get(codes_obj, false, 8, "codes") ||
        !lengths.get(lengths_obj, false, 1, "lengths"))
        return nullptr;
    if (codes.count(8) != lengths.count(1)) {
        PyErr_SetString(PyExc_ValueError, "gap_pack: codes and lengths differ in length");
        return nullptr;
    }
    std::vector<uint8_t> out;
    if (!run_released([&] {
            out = dr::gap_pack(gaps.as<uint64_t>(), gaps.count(8), extra, codes.as<uint64_t>(),
                               lengths.as<uint8_t>(), lengths.count(1));
        }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* rice_pack(PyObject*, PyObject* args) {
    PyObject* gaps_obj;
    int r;
    if (!PyArg_ParseTuple(args, "Oi", &gaps_obj, &r)) return nullptr;
    Buffer gaps;
    if (!gaps.get(gaps_obj, false, 8, "gaps")) return nullptr;
    std::vector<uint8_t> out;
    if (!run_released([&] { out = dr::rice_pack(gaps.as<uint64_t>(), gaps.count(8), r); }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* matrix_histograms(PyObject*, PyObject* args) {
    PyObject* indices_obj;
    long long rows, cols;
    if (!PyArg_ParseTuple(args, "OLL", &indices_obj, &rows, &cols)) return nullptr;
    Buffer indices;
    if (!indices.get(indices_obj, false, 8, "indices")) return nullptr;
    std::vector<int64_t> out;
    if (!run_released([&] {
            out = dr::matrix_histograms(indices.as<int64_t>(), indices.count(8), rows, cols);
        }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* matrix_coding(PyObject*, PyObject* args) {
    PyObject* indices_obj;
    long long rows, cols;
    int transpose;
    if (!PyArg_ParseTuple(args, "OLLp", &indices_obj, &rows, &cols, &transpose)) return nullptr;
    Buffer indices;
    if (!indices.get(indices_obj, false, 8, "indices")) return nullptr;
    dr::MatrixCoding out;
    if (!run_released([&] {
            out = dr::matrix_coding(indices.as<int64_t>(), indices.count(8), rows, cols, transpose);
        }))
        return nullptr;
    PyObject* parts[] = {to_bytearray(out.order), to_bytearray(out.ranked), to_bytearray(out.lines),
                         to_bytearray(out.counts_less_one), to_bytearray(out.steps)};
    for (PyObject* part : parts) {
        if (part) continue;
        for (PyObject* made : parts) Py_XDECREF(made);
        return nullptr;
    }
    return Py_BuildValue("NNNNN", parts[0], parts[1], parts[2], parts[3], parts[4]);
}

// A bytearray of `count` items of T filled by fill(T*) with the GIL released (a body
// decoder writing straight into what Python receives); a DeepReduceError instead when the
// body's bytes could not hold that many (at least bits_each bits an item), so a hostile
// count never sizes an allocation.
template <typename T, typename Fill>
PyObject* decoded_into(const Buffer& body, uint64_t count, uint64_t bits_each, Fill fill) {
    if (count > 8 * static_cast<uint64_t>(body.count(1)) / bits_each) {
        PyErr_SetString(deepreduce_error, "body holds fewer bits than its count needs");
        return nullptr;
    }
    PyObject* out = PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(count * sizeof(T)));
    if (!out) return nullptr;
    T* items = reinterpret_cast<T*>(PyByteArray_AS_STRING(out));
    if (!run_released([&] { fill(items); })) {
        Py_DECREF(out);
        return nullptr;
    }
    return out;
}

PyObject* gap_positions(PyObject*, PyObject* args) {
    PyObject* body_obj;
    unsigned long long count;
    long long size;
    if (!PyArg_ParseTuple(args, "OKL", &body_obj, &count, &size)) return nullptr;
    Buffer body;
    if (!body.get(body_obj, false, 1, "body")) return nullptr;
    return decoded_into<int64_t>(body, count, 1, [&](int64_t* out) {
        dr::gap_positions(body.as<uint8_t>(), body.count(1), count, size, out);
    });
}

PyObject* matrix_decode(PyObject*, PyObject* args) {
    PyObject* body_obj;
    unsigned long long count;
    long long rows, cols;
    int transpose;
    if (!PyArg_ParseTuple(args, "OKLLp", &body_obj, &count, &rows, &cols, &transpose))
        return nullptr;
    Buffer body;
    if (!body.get(body_obj, false, 1, "body")) return nullptr;
    return decoded_into<int64_t>(body, count, 1, [&](int64_t* out) {
        dr::matrix_decode(body.as<uint8_t>(), body.count(1), count, rows, cols, transpose, out);
    });
}

PyObject* entropy_values(PyObject*, PyObject* args) {
    PyObject* body_obj;
    unsigned long long count;
    if (!PyArg_ParseTuple(args, "OK", &body_obj, &count)) return nullptr;
    Buffer body;
    if (!body.get(body_obj, false, 1, "body")) return nullptr;
    return decoded_into<float>(body, count, 2, [&](float* out) {
        dr::entropy_values(body.as<uint8_t>(), body.count(1), count, out);
    });
}

// The arguments of scatter_add and densify, (f32 dst, i64 positions, f32 values, scale),
// checked and handed to kernel(dst, n, positions, values, count, scale) without the GIL.
template <typename Kernel>
bool run_scatter(PyObject* args, const char* what, Kernel kernel) {
    PyObject *dst_obj, *positions_obj, *values_obj;
    double scale;
    if (!PyArg_ParseTuple(args, "OOOd", &dst_obj, &positions_obj, &values_obj, &scale))
        return false;
    Buffer dst, positions, values;
    if (!dst.get(dst_obj, true, 4, "dst") || !positions.get(positions_obj, false, 8, "positions") ||
        !values.get(values_obj, false, 4, "values"))
        return false;
    if (positions.count(8) != values.count(4)) {
        PyErr_Format(PyExc_ValueError, "%s: positions and values differ in length", what);
        return false;
    }
    return run_released([&] {
        kernel(dst.as<float>(), static_cast<int64_t>(dst.count(4)), positions.as<int64_t>(),
               values.as<float>(), values.count(4), static_cast<float>(scale));
    });
}

PyObject* scatter_add(PyObject*, PyObject* args) {
    if (!run_scatter(args, "scatter_add", dr::scatter_add)) return nullptr;
    Py_RETURN_NONE;
}

PyObject* densify(PyObject*, PyObject* args) {
    bool written = false;
    if (!run_scatter(args, "densify", [&](float* dst, int64_t n, const int64_t* positions,
                                          const float* values, size_t count, float scale) {
            written = dr::densify(dst, n, positions, values, count, scale);
        }))
        return nullptr;
    return PyBool_FromLong(written);
}

PyObject* merge_sum(PyObject*, PyObject* args) {
    PyObject *positions_obj, *values_obj, *starts_obj, *out_positions_obj, *out_sums_obj;
    if (!PyArg_ParseTuple(args, "OOOOO", &positions_obj, &values_obj, &starts_obj,
                          &out_positions_obj, &out_sums_obj))
        return nullptr;
    Buffer positions, values, starts, out_positions, out_sums;
    if (!positions.get(positions_obj, false, 8, "positions") ||
        !values.get(values_obj, false, 4, "values") || !starts.get(starts_obj, false, 8, "starts") ||
        !out_positions.get(out_positions_obj, true, 8, "out_positions") ||
        !out_sums.get(out_sums_obj, true, 4, "out_sums"))
        return nullptr;
    size_t runs = starts.count(8) ? starts.count(8) - 1 : 0;
    const int64_t* s = starts.as<int64_t>();
    if (positions.count(8) != values.count(4) || !starts.count(8) || s[0] != 0 ||
        s[runs] != static_cast<int64_t>(positions.count(8)) ||
        out_positions.count(8) < positions.count(8) || out_sums.count(4) < positions.count(8)) {
        PyErr_SetString(PyExc_ValueError, "merge_sum: runs do not cover positions and values, "
                        "or the outputs are too small");
        return nullptr;
    }
    int64_t unique = -1;
    if (!run_released([&] {
            unique = dr::merge_sum(positions.as<int64_t>(), values.as<float>(), s, runs,
                                   out_positions.as<int64_t>(), out_sums.as<float>());
        }))
        return nullptr;
    if (unique < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(unique);
}

PyObject* member_sorted(PyObject*, PyObject* args) {
    PyObject *a_obj, *b_obj;
    if (!PyArg_ParseTuple(args, "OO", &a_obj, &b_obj)) return nullptr;
    Buffer a, b;
    if (!a.get(a_obj, false, 8, "a") || !b.get(b_obj, false, 8, "b")) return nullptr;
    std::vector<uint8_t> in(a.count(8));
    bool ascending = false;
    if (!run_released([&] {
            ascending = dr::member_sorted(a.as<int64_t>(), a.count(8), b.as<int64_t>(),
                                          b.count(8), in.data());
        }))
        return nullptr;
    if (!ascending) Py_RETURN_NONE;
    return to_bytearray(in);
}

PyObject* have_f16c(PyObject*, PyObject*) { return PyBool_FromLong(dr::have_f16c()); }

PyObject* to_half(PyObject*, PyObject* args) {
    PyObject *src_obj, *dst_obj;
    int keep_error;
    if (!PyArg_ParseTuple(args, "OOp", &src_obj, &dst_obj, &keep_error)) return nullptr;
    Buffer src, dst;
    if (!src.get(src_obj, true, 4, "src") || !dst.get(dst_obj, true, 2, "dst")) return nullptr;
    if (src.count(4) != dst.count(2)) {
        PyErr_SetString(PyExc_ValueError, "to_half: src and dst differ in length");
        return nullptr;
    }
    bool finite = false;
    if (!run_released([&] {
            finite = dr::to_half(src.as<float>(), dst.as<uint16_t>(), src.count(4), keep_error);
        }))
        return nullptr;
    return PyBool_FromLong(finite);
}

PyObject* from_half(PyObject*, PyObject* args) {
    PyObject *src_obj, *dst_obj;
    int exponent;
    if (!PyArg_ParseTuple(args, "OOi", &src_obj, &dst_obj, &exponent)) return nullptr;
    Buffer src, dst;
    if (!src.get(src_obj, false, 2, "src") || !dst.get(dst_obj, true, 4, "dst")) return nullptr;
    if (src.count(2) != dst.count(4) || exponent < -128 || exponent > 127) {
        PyErr_SetString(PyExc_ValueError, "from_half: lengths differ or exponent outside -128..127");
        return nullptr;
    }
    if (!run_released([&] {
            dr::from_half(src.as<uint16_t>(), dst.as<float>(), src.count(2), exponent);
        }))
        return nullptr;
    Py_RETURN_NONE;
}

// select_topk(grad, residual_or_None, k) / select_threshold(grad, residual_or_None, tau)
// -> (int64 indices, float32 values) as bytearrays, or None if a value is NaN or Inf.
PyObject* select(PyObject* args, bool topk) {
    PyObject *grad_obj, *residual_obj;
    long long k = 0;
    double tau = 0;
    if (topk ? !PyArg_ParseTuple(args, "OOL", &grad_obj, &residual_obj, &k)
             : !PyArg_ParseTuple(args, "OOd", &grad_obj, &residual_obj, &tau))
        return nullptr;
    Buffer grad, residual;
    if (!grad.get(grad_obj, false, 4, "grad")) return nullptr;
    float* res = nullptr;
    if (residual_obj != Py_None) {
        if (!residual.get(residual_obj, true, 4, "residual")) return nullptr;
        if (residual.count(4) != grad.count(4)) {
            PyErr_SetString(PyExc_ValueError, "residual and gradient differ in size");
            return nullptr;
        }
        res = residual.as<float>();
    }
    std::vector<int64_t> indices;
    std::vector<float> values;
    bool finite = false;
    int64_t n = static_cast<int64_t>(grad.count(4));
    if (!run_released([&] {
            finite = topk ? dr::select_topk(grad.as<float>(), res, n, k, &indices, &values)
                          : dr::select_threshold(grad.as<float>(), res, n,
                                                 static_cast<float>(tau), &indices, &values);
        }))
        return nullptr;
    if (!finite) Py_RETURN_NONE;
    PyObject* idx = to_bytearray(indices);
    if (!idx) return nullptr;
    PyObject* val = to_bytearray(values);
    if (!val) {
        Py_DECREF(idx);
        return nullptr;
    }
    return Py_BuildValue("NN", idx, val);
}

PyObject* select_topk(PyObject*, PyObject* args) { return select(args, true); }
PyObject* select_threshold(PyObject*, PyObject* args) { return select(args, false); }

PyObject* bloom_insert(PyObject*, PyObject* args) {
    PyObject* positions_obj;
    unsigned long long m, seed_key;
    int h;
    if (!PyArg_ParseTuple(args, "OKiK", &positions_obj, &m, &h, &seed_key)) return nullptr;
    Buffer positions;
    if (!positions.get(positions_obj, false, 8, "positions")) return nullptr;
    std::vector<uint8_t> out;
    if (!run_released([&] {
            out = dr::bloom_insert(positions.as<int64_t>(), positions.count(8), m, h, seed_key);
        }))
        return nullptr;
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(out.data()),
                                     static_cast<Py_ssize_t>(out.size()));
}

PyObject* bloom_query(PyObject*, PyObject* args) {
    PyObject* filter_obj;
    unsigned long long m, seed_key;
    long long size, max_positives;
    int h, threads;
    if (!PyArg_ParseTuple(args, "OKiKLiL", &filter_obj, &m, &h, &seed_key, &size, &threads,
                          &max_positives))
        return nullptr;
    Buffer filter;
    if (!filter.get(filter_obj, false, 1, "filter")) return nullptr;
    if (filter.count(1) != (m + 7) / 8) {
        PyErr_SetString(deepreduce_error, "bloom: filter length does not match m");
        return nullptr;
    }
    std::vector<int64_t> out;
    if (!run_released([&] {
            out = dr::bloom_query(filter.as<uint8_t>(), m, h, seed_key, size, threads,
                                  max_positives);
        }))
        return nullptr;
    return to_bytearray(out);
}

PyObject* bloom_conflicts(PyObject*, PyObject* args) {
    PyObject* positions_obj;
    unsigned long long m, seed_key;
    int h;
    if (!PyArg_ParseTuple(args, "OKiK", &positions_obj, &m, &h, &seed_key)) return nullptr;
    Buffer positions;
    if (!positions.get(positions_obj, false, 8, "positions")) return nullptr;
    std::vector<int64_t> out;
    if (!run_released([&] {
            out = dr::bloom_conflicts(positions.as<int64_t>(), positions.count(8), m, h, seed_key);
        }))
        return nullptr;
    return to_bytearray(out);
}

PyMethodDef methods[] = {
    {"pack_fields", pack_fields, METH_VARARGS, "pack_fields(u64 values, i64 widths) -> bytes"},
    {"huffman_pack", huffman_pack, METH_VARARGS,
     "huffman_pack(i64 symbols, u64 codes, u8 lengths, u8 bits) -> bytes: codes, then bits"},
    {"pack_fixed", pack_fixed, METH_VARARGS, "pack_fixed(u64 values, width) -> bytes"},
    {"read_fixed", read_fixed, METH_VARARGS, "read_fixed(data, start, count, width) -> u64"},
    {"read_fields", read_fields, METH_VARARGS, "read_fields(data, start, i64 widths) -> u64"},
    {"huffman_decode", huffman_decode, METH_VARARGS,
     "huffman_decode(data, start, u8 lengths, count) -> (u32 symbols, end bit)"},
    {"huffman_lengths", huffman_lengths, METH_VARARGS,
     "huffman_lengths(i64 freqs, max_length) -> u8 code lengths"},
    {"rice_positions", rice_positions, METH_VARARGS,
     "rice_positions(data, start, count, r, size) -> (i64 positions, end bit)"},
    {"gap_histogram", gap_histogram, METH_VARARGS,
     "gap_histogram(u64 gaps) -> i64 (length, top bits) histogram"},
    {"gap_plan_bytes", gap_plan_bytes, METH_VARARGS,
     "gap_plan_bytes(i64 histogram) -> i64 body bytes for extra = 0..3"},
    {"gap_pack", gap_pack, METH_VARARGS,
     "gap_pack(u64 gaps, extra, u64 codes, u8 lengths) -> bytes"},
    {"rice_pack", rice_pack, METH_VARARGS, "rice_pack(u64 gaps, r) -> bytes"},
    {"matrix_histograms", matrix_histograms, METH_VARARGS,
     "matrix_histograms(i64 ascending positions, rows, cols) -> i64 [2 x (lines, ranked, "
     "3 gap histograms)]"},
    {"matrix_coding", matrix_coding, METH_VARARGS,
     "matrix_coding(i64 sorted positions, rows, cols, transpose) -> (i64 order, i64 ranked, "
     "i64 lines, u64 counts - 1, u64 rank steps)"},
    {"gap_positions", gap_positions, METH_VARARGS,
     "gap_positions(Huffman gap body, count, size) -> i64 ascending positions"},
    {"matrix_decode", matrix_decode, METH_VARARGS,
     "matrix_decode(matrix body, count, rows, cols, transpose) -> i64 positions, coding order"},
    {"entropy_values", entropy_values, METH_VARARGS,
     "entropy_values(entropy value body, count) -> f32 values"},
    {"scatter_add", scatter_add, METH_VARARGS,
     "scatter_add(f32 dst, i64 positions, f32 values, scale): dst[p] += v * scale"},
    {"densify", densify, METH_VARARGS,
     "densify(f32 dst, i64 ascending positions, f32 values, scale) -> written: dst = 0, "
     "dst[p] = 0 + v * scale"},
    {"merge_sum", merge_sum, METH_VARARGS,
     "merge_sum(i64 positions, f32 values, i64 run starts, i64 out, f32 out) -> count or None"},
    {"member_sorted", member_sorted, METH_VARARGS,
     "member_sorted(i64 a, i64 b) -> u8 a[i] in b, or None unless both ascend"},
    {"have_f16c", have_f16c, METH_NOARGS, "have_f16c() -> whether to_half works here"},
    {"from_half", from_half, METH_VARARGS,
     "from_half(u16 src, f32 dst, exponent): dst = float(src) * 2**-exponent (F16C)"},
    {"to_half", to_half, METH_VARARGS,
     "to_half(f32 src, u16 dst, keep_error) -> all finite: dst = half(src) [, src -= float(dst)]"},
    {"select_topk", select_topk, METH_VARARGS,
     "select_topk(f32 grad, f32 residual or None, k) -> (i64 indices, f32 values) or None"},
    {"select_threshold", select_threshold, METH_VARARGS,
     "select_threshold(f32 grad, f32 residual or None, tau) -> (i64, f32) or None"},
    {"bloom_insert", bloom_insert, METH_VARARGS,
     "bloom_insert(i64 positions, m, h, seed_key) -> filter bytes"},
    {"bloom_query", bloom_query, METH_VARARGS,
     "bloom_query(filter, m, h, seed_key, size, threads, max_positives) -> i64 positions"},
    {"bloom_conflicts", bloom_conflicts, METH_VARARGS,
     "bloom_conflicts(i64 positives, m, h, seed_key) -> i64 smallest conflict-set sizes"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                      "DeepReduce's native codec engine (C++, GIL released).", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
    PyObject* errors = PyImport_ImportModule("deepreduce_hvd.errors");
    if (!errors) return nullptr;
    deepreduce_error = PyObject_GetAttrString(errors, "DeepReduceError");
    Py_DECREF(errors);
    if (!deepreduce_error) return nullptr;
    return PyModule_Create(&module);
}
