# Writes ${CMAKE_BINARY_DIR}/conveyor_link_graph.tsv: one line per target of this project, with
# its type, the folder it is defined in (relative to the source root) and its direct link
# libraries (LINK_LIBRARIES: PUBLIC and PRIVATE; INTERFACE_LINK_LIBRARIES for interface
# libraries). tests/floors_test.py checks it against cmake/floors.txt. Included at the end of the
# top-level CMakeLists.txt, when every target_link_libraries call has been made.
function(conveyor_collect_targets dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    conveyor_collect_targets("${sub}" sub_targets)
    list(APPEND targets ${sub_targets})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

conveyor_collect_targets("${PROJECT_SOURCE_DIR}" conveyor_all_targets)
set(conveyor_graph "# target\ttype\tfolder\tdirect links (;-separated)\n")
foreach(t IN LISTS conveyor_all_targets)
  get_target_property(type ${t} TYPE)
  get_target_property(dir ${t} SOURCE_DIR)
  file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${dir}")
  if(type STREQUAL "INTERFACE_LIBRARY")
    get_target_property(links ${t} INTERFACE_LINK_LIBRARIES)
  else()
    get_target_property(links ${t} LINK_LIBRARIES)
  endif()
  if(NOT links)
    set(links "")
  endif()
  string(APPEND conveyor_graph "${t}\t${type}\t${rel}\t${links}\n")
endforeach()
file(WRITE "${CMAKE_BINARY_DIR}/conveyor_link_graph.tsv" "${conveyor_graph}")
