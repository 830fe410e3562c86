// GCC 12's AVX-512 headers trip -Wuninitialized and -Wmaybe-uninitialized on
// their own _mm512_undefined_* placeholders once inlined (GCC PR 105593). The
// warnings point at the headers' lines, so the pragmas must be in force before
// the headers are read: a file with AVX-512 code includes this first. (Not
// pushed and popped on purpose: it has to reach the end of the file.)
#pragma once
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
