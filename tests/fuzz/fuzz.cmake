# Injected by tests/fuzz/run.sh with -DCMAKE_PROJECT_INCLUDE=<this file>; runs right after
# project(). Sanitizer compile flags come from run.sh (CMAKE_CXX_FLAGS, for every target). The
# libFuzzer runtime (its main) must be linked into the fuzz executables only: putting
# -fsanitize=fuzzer in CMAKE_EXE_LINKER_FLAGS would break every other executable and CMake's own
# try_compile checks (two mains). So add it to each fuzz target once the whole tree is configured,
# unless tests/CMakeLists.txt already does.
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _kiln_fuzz_link_libfuzzer)
function(_kiln_fuzz_link_libfuzzer)
  foreach(_t kiln_fuzz_import kiln_fuzz_npy kiln_fuzz_run kiln_fuzz_engine kiln_fuzz_ir_text kiln_fuzz_kserve
          kiln_fuzz_grpc kiln_fuzz_calib)
    if(NOT TARGET ${_t})
      message(FATAL_ERROR "tests/fuzz/fuzz.cmake: no ${_t} target (configure with -DKILN_FUZZ=ON)")
    endif()
    get_target_property(_opts ${_t} LINK_OPTIONS)
    if(NOT "${_opts}" MATCHES "-fsanitize=([a-z,]*,)?fuzzer([,;]|$)")
      target_link_options(${_t} PRIVATE -fsanitize=fuzzer)
    endif()
  endforeach()
endfunction()
