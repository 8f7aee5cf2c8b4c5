# commit.cmake - writes OUT (a header defining CN_COMMIT) from `git describe` of SRC, rewriting it
# only when the text changes, so a build after a new commit recompiles main.c and nothing else.
# Run at every build by the cairn_commit target; outside a git checkout the commit is "unknown".
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
endif()
set(text "#define CN_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE "${OUT}" "${text}")
endif()
