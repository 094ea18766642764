# CTest driver (script mode) for the installed-package test:
#   cmake -DDECA_BUILD_DIR=<deca build> -DCONSUMER_SOURCE=<this folder> -DWORK_DIR=<scratch>
#         [-DCONSUMER_EXE=<executable, default deca_consumer>]
#         [-DREADME=<file> -DREADME_SNIPPET=<file>] -P run_consumer_test.cmake
# Installs the built deca into WORK_DIR/prefix, builds the tiny project of CONSUMER_SOURCE
# against it with find_package(deca), and runs CONSUMER_EXE. With README and README_SNIPPET it
# first checks that the README quotes the snippet file verbatim (the README's example is the file
# this test builds and runs). Any failing step is a FATAL_ERROR with its output.
foreach(var DECA_BUILD_DIR CONSUMER_SOURCE WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED CONSUMER_EXE)
  set(CONSUMER_EXE deca_consumer)
endif()

if(DEFINED README)
  file(READ ${README} readme_text)
  file(READ ${README_SNIPPET} snippet_text)
  string(FIND "${readme_text}" "${snippet_text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "consumer test: ${README} does not quote ${README_SNIPPET} verbatim: "
                        "paste the file into the README's code block again")
  endif()
  message(STATUS "consumer test: ${README} quotes ${README_SNIPPET}: ok")
endif()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: ${name} failed (exit ${rc}):\n${ARGN}\n${out}")
  endif()
  message(STATUS "consumer test: ${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# Only the library's component: deca-bench and the tests need not be built for this.
run_step("install" ${CMAKE_COMMAND} --install ${DECA_BUILD_DIR} --prefix ${prefix}
         --component deca)
if(NOT EXISTS ${prefix}/include/deca/deca.hpp)
  message(FATAL_ERROR "consumer test: install put no include/deca/deca.hpp under ${prefix}")
endif()

run_step("configure" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${build}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run_step("build" ${CMAKE_COMMAND} --build ${build})
run_step("run" ${build}/${CONSUMER_EXE})
message(STATUS "${step_output}")
