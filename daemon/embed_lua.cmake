# Embeds lua/*.lua in the daemon as C++ string literals (run by
# daemon/CMakeLists.txt at build time with `cmake -P`), so the .lua files stay
# the single source of truth: editing one rebuilds sluice_scripts.
#
# In:  LUA_DIR (folder of the scripts), SCRIPTS (names without ".lua",
#      separated by commas), OUTPUT (the .inc file to write).
# Out: one `constexpr std::string_view kLua_<name>` per script, holding the
#      file's exact bytes as a raw string literal.
string(REPLACE "," ";" _scripts "${SCRIPTS}")
set(_delimiter "sluice_lua")
set(_text "// Generated from lua/*.lua by daemon/embed_lua.cmake at build time; do not edit.\n")
foreach(_name IN LISTS _scripts)
  file(READ "${LUA_DIR}/${_name}.lua" _source)
  string(FIND "${_source}" ")${_delimiter}\"" _clash)
  if(NOT _clash EQUAL -1)
    message(FATAL_ERROR "${_name}.lua contains )${_delimiter}\", which ends the raw string literal")
  endif()
  string(APPEND _text "inline constexpr std::string_view kLua_${_name} = R\"${_delimiter}(${_source})${_delimiter}\";\n")
endforeach()
file(WRITE "${OUTPUT}" "${_text}")
