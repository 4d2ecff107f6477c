# Warnings and sanitizer flags for every target of the project.

set(KVL_WARNING_FLAGS
  -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
  -Wpointer-arith -Wformat=2 -Wvla -Wundef)
add_compile_options("$<$<COMPILE_LANGUAGE:C>:${KVL_WARNING_FLAGS}>")
if(KVL_WERROR)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:-Werror>")
endif()

if(KVL_SANITIZE)
  string(REPLACE "," ";" _kvl_san_list "${KVL_SANITIZE}")
  foreach(_s IN LISTS _kvl_san_list)
    if(NOT _s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "KVL_SANITIZE: unknown sanitizer '${_s}' "
                          "(use \"address,undefined\" or \"thread\")")
    endif()
  endforeach()
  if("thread" IN_LIST _kvl_san_list AND "address" IN_LIST _kvl_san_list)
    message(FATAL_ERROR "KVL_SANITIZE: thread and address cannot be combined")
  endif()
  set(_kvl_san_flags "-fsanitize=${KVL_SANITIZE}" -fno-omit-frame-pointer)
  if("undefined" IN_LIST _kvl_san_list)
    list(APPEND _kvl_san_flags -fno-sanitize-recover=all)
  endif()
  add_compile_options(${_kvl_san_flags})
  add_link_options(${_kvl_san_flags})
  message(STATUS "kvlane: sanitizers ${KVL_SANITIZE}")
endif()
