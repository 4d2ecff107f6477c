# Test registration for kvlane (included from the top-level CMakeLists.txt).
#
#   tests/unit/test_*.c, tests/integration/test_*.c
#       one executable each (build/tests/<name>), linked to libkvlane.a and
#       pthread, registered as test <name>.
#   tests/integration/test_*.sh
#       run with bash, registered as test <name>.
#   tests/common/*.c (optional)
#       helpers compiled once into kvl_testutil and linked into every C test.
#
# Every test: exit 0 pass, 77 skip (print why), anything else fails; TIMEOUT
# 300 s (or its KVL_TEST_TIMEOUT marker); run in the build directory with KVL_TEST_BIN and KVL_BIN (the kvlane
# CLI), KVL_BUILD (build dir) and KVL_SRC (source dir) in the environment.
#
# Labels: "unit" or "integration" by folder; "tsan" when the file name
# contains "_mt" or "concurrency"; plus any words after a marker
#     KVL_TEST_LABELS: nosan slow
# in the first 4 KiB of the file (in a comment). "nosan" keeps a test out of
# the sanitizer suites; "tsan" puts it in tsan_suite.
#
# A test that fails allocations on purpose names the functions it wraps
#     KVL_TEST_WRAP: malloc
# (linked with -Wl,--wrap=<name>: it defines __wrap_<name> and calls
# __real_<name>; only the test's executable is affected).
#
# --wrap cannot reach a call made by a backend module (libkvlane-ucx.so,
# loaded at run time): a test that stands in for a function such a module
# takes from a shared library (UCX's ucp_get_nbx) names it
#     KVL_TEST_INTERPOSE: ucp_get_nbx
# and defines it under its own name: the executable exports that symbol
# (-Wl,--export-dynamic-symbol=<name>), so the module, loaded later, binds
# to it first; the test reaches the real one through kt_ucx_real() (dlsym in
# the library the module loaded).

find_program(KVL_BASH bash REQUIRED)

set(KVL_TEST_ENV
  "KVL_TEST_BIN=${KVL_CLI_PATH}"
  "KVL_BIN=${KVL_CLI_PATH}"
  "KVL_BUILD=${CMAKE_BINARY_DIR}"
  "KVL_SRC=${CMAKE_SOURCE_DIR}")

function(kvl_test_labels out_var file kind)
  set(labels ${kind})
  get_filename_component(name "${file}" NAME_WE)
  if(name MATCHES "_mt|concurrency")
    list(APPEND labels tsan)
  endif()
  file(STRINGS "${file}" markers LIMIT_INPUT 4096 REGEX "KVL_TEST_LABELS:")
  foreach(line IN LISTS markers)
    string(REGEX REPLACE ".*KVL_TEST_LABELS:" "" rest "${line}")
    string(REGEX REPLACE "\\*/.*" "" rest "${rest}")
    string(REGEX MATCHALL "[A-Za-z0-9_.-]+" words "${rest}")
    list(APPEND labels ${words})
  endforeach()
  list(REMOVE_DUPLICATES labels)
  # Labels come from the file's text: re-configure when it changes.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}")
  set(${out_var} "${labels}" PARENT_SCOPE)
endfunction()

# A test's bound in seconds: 300, or its "KVL_TEST_TIMEOUT: <s>" marker (in
# its first 4 KiB) for the long ones, so that a loaded machine (the suite
# under stress --cpu 2 beside other builds) slows them without failing them.
function(kvl_test_timeout out_var file)
  set(t 300)
  file(STRINGS "${file}" markers LIMIT_INPUT 4096 REGEX "KVL_TEST_TIMEOUT: *[0-9]+")
  foreach(line IN LISTS markers)
    string(REGEX REPLACE ".*KVL_TEST_TIMEOUT: *([0-9]+).*" "\\1" t "${line}")
  endforeach()
  set(${out_var} ${t} PARENT_SCOPE)
endfunction()

set(_kvl_test_names "")
function(kvl_claim_test_name name file)
  if(name IN_LIST _kvl_test_names)
    message(FATAL_ERROR "kvlane: two tests named ${name} (second: ${file}); rename one")
  endif()
  list(APPEND _kvl_test_names ${name})
  set(_kvl_test_names "${_kvl_test_names}" PARENT_SCOPE)
endfunction()

# The link options a test's markers ask for: each word after "<marker>:"
# becomes <prefix><word>.
function(kvl_test_link_marker target file marker prefix)
  file(STRINGS "${file}" markers LIMIT_INPUT 4096 REGEX "${marker}:")
  foreach(line IN LISTS markers)
    string(REGEX REPLACE ".*${marker}:" "" rest "${line}")
    string(REGEX REPLACE "\\*/.*" "" rest "${rest}")
    string(REGEX MATCHALL "[A-Za-z_][A-Za-z0-9_]*" words "${rest}")
    foreach(w IN LISTS words)
      target_link_options(${target} PRIVATE "${prefix}${w}")
    endforeach()
  endforeach()
endfunction()

# ---- helpers shared by C tests -------------------------------------------
file(GLOB KVL_TEST_COMMON_SOURCES CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/common/*.c")
if(KVL_TEST_COMMON_SOURCES)
  add_library(kvl_testutil STATIC ${KVL_TEST_COMMON_SOURCES})
  target_include_directories(kvl_testutil PUBLIC "${CMAKE_SOURCE_DIR}/tests" "${CMAKE_SOURCE_DIR}/src")
  target_link_libraries(kvl_testutil PUBLIC kvlane_static Threads::Threads)
endif()

# ---- C tests ---------------------------------------------------------------
foreach(_kind unit integration)
  file(GLOB _srcs CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/${_kind}/test_*.c")
  list(SORT _srcs)
  foreach(_src IN LISTS _srcs)
    get_filename_component(_name "${_src}" NAME_WE)
    kvl_claim_test_name(${_name} "${_src}")
    add_executable(${_name} "${_src}")
    set_target_properties(${_name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
    target_include_directories(${_name} PRIVATE "${CMAKE_SOURCE_DIR}/tests" "${CMAKE_SOURCE_DIR}/src")
    target_link_libraries(${_name} PRIVATE kvlane_static Threads::Threads)
    if(TARGET kvl_testutil)
      target_link_libraries(${_name} PRIVATE kvl_testutil)
    endif()
    # tests of the etcd store's internals (test_etcd_parse) see its headers
    if(KVL_HAVE_ETCD)
      target_compile_definitions(${_name} PRIVATE KVL_HAVE_ETCD=1)
      target_link_libraries(${_name} PRIVATE ${KVL_ETCD_LINK})
    endif()
    kvl_test_labels(_labels "${_src}" ${_kind})
    kvl_test_timeout(_timeout "${_src}")
    kvl_test_link_marker(${_name} "${_src}" KVL_TEST_WRAP "-Wl,--wrap=")
    kvl_test_link_marker(${_name} "${_src}" KVL_TEST_INTERPOSE "LINKER:--export-dynamic-symbol=")
    add_test(NAME ${_name} COMMAND ${_name} WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
    set_tests_properties(${_name} PROPERTIES
      SKIP_RETURN_CODE 77
      TIMEOUT ${_timeout}
      ENVIRONMENT "${KVL_TEST_ENV}"
      LABELS "${_labels}")
  endforeach()
endforeach()

# ---- a stand-in CUDA driver and libcufile (tests/fakes/fake_gpu.c) ---------
# for test_posix_gds_fake (GPUDirect Storage's code path without a GPU) and
# test_cuda_pin_fake (the cuda backend pinning host memory).
add_library(kvl_fake_gpu MODULE "${CMAKE_SOURCE_DIR}/tests/fakes/fake_gpu.c")
set_target_properties(kvl_fake_gpu PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
target_compile_options(kvl_fake_gpu PRIVATE -Wno-missing-prototypes)
target_link_libraries(kvl_fake_gpu PRIVATE Threads::Threads)
foreach(_t test_posix_gds_fake test_cuda_pin_fake)
  if(TARGET ${_t})
    add_dependencies(${_t} kvl_fake_gpu)
  endif()
endforeach()

# ---- shell integration tests ----------------------------------------------
file(GLOB _sh CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/integration/test_*.sh")
list(SORT _sh)
foreach(_src IN LISTS _sh)
  get_filename_component(_name "${_src}" NAME_WE)
  kvl_claim_test_name(${_name} "${_src}")
  kvl_test_labels(_labels "${_src}" integration)
  kvl_test_timeout(_timeout "${_src}")
  add_test(NAME ${_name} COMMAND "${KVL_BASH}" "${_src}" WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
  set_tests_properties(${_name} PROPERTIES
    SKIP_RETURN_CODE 77
    TIMEOUT ${_timeout}
    ENVIRONMENT "${KVL_TEST_ENV}"
    LABELS "${_labels}")
endforeach()

# ---- fuzzing (libFuzzer; see cmake/run_fuzz.sh) ----------------------------
if(KVL_FUZZ)
  set(KVL_FUZZ_SECONDS 30 CACHE STRING "Seconds each fuzz target runs in the fuzz_metadata test")
  file(GLOB _fuzz CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_*.c")
  list(LENGTH _fuzz _nfuzz)
  # The library sources exactly as this build compiles them (no CLI).
  string(REPLACE ";" "\n" _lib_lines "${KVL_LIB_SOURCES}")
  file(WRITE "${CMAKE_BINARY_DIR}/fuzz/lib_sources.txt" "${_lib_lines}\n")
  # ... with the optional parts this build has: their defines and headers
  # (lib_cflags.txt) and libraries (lib_libs.txt), one word a line
  set(_fz_cflags "")
  set(_fz_libs "")
  # the built-in backends the library registers (backend_table.c)
  foreach(_bk IN LISTS KVL_BUILTIN_BACKENDS)
    file(GLOB _bk_src CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/src/backends/${_bk}/*.c")
    if(_bk_src)
      string(TOUPPER "${_bk}" _BK)
      list(APPEND _fz_cflags -DKVL_HAVE_${_BK}=1)
    endif()
  endforeach()
  if(KVL_HAVE_ETCD)
    list(APPEND _fz_cflags -DKVL_HAVE_ETCD=1)
    foreach(_d IN LISTS KVL_CURL_INCLUDE_DIRS KVL_JSONC_INCLUDE_DIRS KVL_NGHTTP2_INCLUDE_DIRS)
      list(APPEND _fz_cflags "-I${_d}")
    endforeach()
    list(APPEND _fz_libs ${KVL_CURL_LDFLAGS} ${KVL_JSONC_LDFLAGS} ${KVL_NGHTTP2_LDFLAGS})
  endif()
  if(KVL_URING_LINK)
    list(APPEND _fz_cflags -DKVL_HAVE_LIBURING=1 "-I${KVL_LIBURING_INCLUDE}")
    list(APPEND _fz_libs "${KVL_URING_LINK}")
  endif()
  string(REPLACE ";" "\n" _fz_cflags "${_fz_cflags}")
  string(REPLACE ";" "\n" _fz_libs "${_fz_libs}")
  file(WRITE "${CMAKE_BINARY_DIR}/fuzz/lib_cflags.txt" "${_fz_cflags}\n")
  file(WRITE "${CMAKE_BINARY_DIR}/fuzz/lib_libs.txt" "${_fz_libs}\n")
  math(EXPR _fuzz_timeout "300 + ${_nfuzz} * (${KVL_FUZZ_SECONDS} + 60)")
  add_test(NAME fuzz_metadata
           COMMAND "${KVL_BASH}" "${CMAKE_SOURCE_DIR}/cmake/run_fuzz.sh"
                   "${CMAKE_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/fuzz"
           WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
  set_tests_properties(fuzz_metadata PROPERTIES
    SKIP_RETURN_CODE 77
    TIMEOUT ${_fuzz_timeout}
    LABELS "fuzz"
    ENVIRONMENT "KVL_CLANG=${KVL_CLANG};KVL_FUZZ_SECONDS=${KVL_FUZZ_SECONDS};KVL_WERROR=${KVL_WERROR}")
endif()

# ---- sanitizer suites (second build trees under this one) ------------------
if(NOT KVL_SANITIZE AND KVL_SANITIZER_TESTS)
  set(_san_env
    "KVL_CLANG=${KVL_CLANG}"
    "KVL_CMAKE=${CMAKE_COMMAND}"
    "KVL_CTEST=${CMAKE_CTEST_COMMAND}"
    "KVL_WERROR=${KVL_WERROR}")
  foreach(_suite asan tsan)
    if(_suite STREQUAL "asan")
      set(_test asan_ubsan_suite)
    else()
      set(_test tsan_suite)
    endif()
    add_test(NAME ${_test}
             COMMAND "${KVL_BASH}" "${CMAKE_SOURCE_DIR}/cmake/run_sanitizer_suite.sh"
                     ${_suite} "${CMAKE_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/san-${_suite}"
             WORKING_DIRECTORY "${CMAKE_BINARY_DIR}")
    set_tests_properties(${_test} PROPERTIES
      SKIP_RETURN_CODE 77
      TIMEOUT 1800
      LABELS "sanitizer"
      ENVIRONMENT "${_san_env}")
  endforeach()
endif()
