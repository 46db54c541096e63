// Bloom-filter insertion and whole-tensor query for DeepReduce's "bloom" index codec.
//
// The hash scheme is defined once, in deepreduce_hvd/bloom_filter.py, and mirrored here bit
// for bit: key = fmix64(position + seed_key); h1 = low 32 bits, h2 = high 32 bits | 1;
// probe j sets bit ((h1 + j*h2) mod 2^32) * m >> 32. Filters are little-endian bit arrays.
// query() scans every position of the tensor on several threads with the GIL released.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

inline uint32_t probe(uint32_t h1, uint32_t h2, uint32_t j, uint64_t m) {
    uint32_t g = h1 + j * h2;  // wraps mod 2^32 by definition
    return static_cast<uint32_t>((static_cast<uint64_t>(g) * m) >> 32);
}

bool check_params(unsigned long long m, int h) {
    if (m == 0 || m > 0xFFFFFFFFULL || h < 1 || h > 64) {
        PyErr_SetString(PyExc_ValueError, "bloom: need 0 < m < 2**32 and 1 <= h <= 64");
        return false;
    }
    return true;
}

PyObject* insert(PyObject*, PyObject* args) {
    Py_buffer positions;
    unsigned long long m, seed_key;
    int h;
    if (!PyArg_ParseTuple(args, "y*KiK", &positions, &m, &h, &seed_key)) return nullptr;
    if (!check_params(m, h) || positions.len % 8) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bloom: positions must be int64");
        PyBuffer_Release(&positions);
        return nullptr;
    }
    std::vector<uint8_t> bits((m + 7) / 8, 0);
    const int64_t* pos = static_cast<const int64_t*>(positions.buf);
    Py_ssize_t n = positions.len / 8;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; ++i) {
        uint64_t key = fmix64(static_cast<uint64_t>(pos[i]) + seed_key);
        uint32_t h1 = static_cast<uint32_t>(key), h2 = static_cast<uint32_t>(key >> 32) | 1u;
        for (int j = 0; j < h; ++j) {
            uint32_t b = probe(h1, h2, j, m);
            bits[b >> 3] |= static_cast<uint8_t>(1u << (b & 7));
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&positions);
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(bits.data()), bits.size());
}

inline bool test_bit(const uint8_t* bits, uint32_t b) { return (bits[b >> 3] >> (b & 7)) & 1u; }

// Scans [lo, hi) in blocks: the first three probes of every position are tested without a
// branch and the survivors (about an eighth) compacted, so the unpredictable branch is taken
// once per survivor instead of once per position.
void query_range(const uint8_t* bits, uint64_t m, int h, uint64_t seed_key, int64_t lo,
                 int64_t hi, std::vector<int64_t>* out) {
    constexpr int kBlock = 256;
    int64_t cand[kBlock];
    uint32_t c1[kBlock], c2[kBlock];
    const int first = std::min(h, 3);
    for (int64_t base = lo; base < hi; base += kBlock) {
        int n = static_cast<int>(std::min<int64_t>(kBlock, hi - base)), kept = 0;
        for (int t = 0; t < n; ++t) {
            int64_t i = base + t;
            uint64_t key = fmix64(static_cast<uint64_t>(i) + seed_key);
            uint32_t h1 = static_cast<uint32_t>(key), h2 = static_cast<uint32_t>(key >> 32) | 1u;
            bool hit = test_bit(bits, probe(h1, h2, 0, m));
            for (int j = 1; j < first; ++j) hit &= test_bit(bits, probe(h1, h2, j, m));
            cand[kept] = i;
            c1[kept] = h1;
            c2[kept] = h2;
            kept += hit;
        }
        for (int t = 0; t < kept; ++t) {
            int j = first;
            while (j < h && test_bit(bits, probe(c1[t], c2[t], j, m))) ++j;
            if (j == h) out->push_back(cand[t]);
        }
    }
}

PyObject* query(PyObject*, PyObject* args) {
    Py_buffer filter;
    unsigned long long m, seed_key;
    long long size;
    int h, threads;
    if (!PyArg_ParseTuple(args, "y*KiKLi", &filter, &m, &h, &seed_key, &size, &threads))
        return nullptr;
    if (!check_params(m, h) || size < 0 || static_cast<unsigned long long>(filter.len) != (m + 7) / 8) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bloom: filter length or size");
        PyBuffer_Release(&filter);
        return nullptr;
    }
    const uint8_t* bits = static_cast<const uint8_t*>(filter.buf);
    int nthreads = std::max(1, std::min<int>(threads, static_cast<int>(size / 65536) + 1));
    std::vector<std::vector<int64_t>> parts(nthreads);
    Py_BEGIN_ALLOW_THREADS
    std::vector<std::thread> pool;
    int64_t chunk = (size + nthreads - 1) / nthreads;
    for (int t = 0; t < nthreads; ++t) {
        int64_t lo = std::min<int64_t>(size, t * chunk), hi = std::min<int64_t>(size, lo + chunk);
        pool.emplace_back(query_range, bits, m, h, seed_key, lo, hi, &parts[t]);
    }
    for (auto& th : pool) th.join();
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&filter);
    size_t total = 0;
    for (auto& p : parts) total += p.size();
    PyObject* result = PyBytes_FromStringAndSize(nullptr, total * sizeof(int64_t));
    if (!result) return nullptr;
    char* dst = PyBytes_AS_STRING(result);
    for (auto& p : parts) {
        std::memcpy(dst, p.data(), p.size() * sizeof(int64_t));
        dst += p.size() * sizeof(int64_t);
    }
    return result;
}

PyMethodDef methods[] = {
    {"insert", insert, METH_VARARGS,
     "insert(positions_int64, m, h, seed_key) -> filter bytes"},
    {"query", query, METH_VARARGS,
     "query(filter, m, h, seed_key, size, threads) -> int64 bytes of positive positions"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_bloom",
                      "C++ Bloom-filter insert and query for deepreduce_hvd.", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__bloom() { return PyModule_Create(&module); }
