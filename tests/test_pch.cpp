// The translation unit that builds the tests' shared precompiled header
// (tests/CMakeLists.txt: zack_test_pch); it defines nothing itself.
