#!/usr/bin/python3
"""Dependencies point down: every library and every #include against cmake/floors.txt.

Usage: floors_test.py SOURCE_DIR LINK_GRAPH_TSV

cmake/floors.txt lists the floors of the tree, lowest first (one line per floor, the top-level
folders on it). A library defined in folder F may link libraries of F and of folders on lower
floors; a source file in F may include headers of those folders only. Peers on one floor never
link or include each other. The link graph is the one CMake resolved at configure time
(cmake/LinkGraph.cmake writes it), so a target_link_libraries call added anywhere, in any
sub-folder, is seen. Includes are read from every .h, .cc and .cu file under a floor's folder;
"conveyor/..." and "tensorflow/..." (the generated protocol headers) count as proto/.

Before checking the tree, a control: the same checks run on a made-up graph and file with one
upward link and one upward include must report both, so a broken checker cannot pass silently.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
TARGET_NAME = re.compile(r"[A-Za-z0-9_.+-]+(?:::[A-Za-z0-9_.+-]+)?")
SOURCE_SUFFIXES = (".h", ".cc", ".cu")


def read_floors(path):
    floors = {}
    with open(path) as f:
        level = 0
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            for folder in line.split():
                if folder in floors:
                    raise SystemExit(f"{path}: folder {folder} named twice")
                floors[folder] = level
            level += 1
    return floors


def read_graph(path):
    """{target: (type, folder, [direct link items])}"""
    graph = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                raise SystemExit(f"{path}: malformed line: {line!r}")
            name, ttype, folder, links = parts
            items = []
            for item in links.split(";"):
                # $<LINK_ONLY:x>, $<TARGET_NAME_IF_EXISTS:x> and the like: the names inside.
                items.extend(TARGET_NAME.findall(item) if "$<" in item else [item.strip()])
            graph[name] = (ttype, folder, [i for i in items if i])
    return graph


def top_folder(rel):
    return rel.split("/", 1)[0] if rel else ""


def link_violations(graph, floors):
    out = []
    for name, (ttype, folder, links) in sorted(graph.items()):
        if not ttype.endswith("_LIBRARY"):
            continue  # executables are leaves: nothing links them
        f = top_folder(folder)
        if f == "":
            continue  # the top-level CMakeLists.txt's build settings (conveyor_warnings)
        if f not in floors:
            out.append(f"{name} ({folder}/): folder {f}/ has no floor in cmake/floors.txt")
            continue
        for dep in links:
            if dep not in graph:
                continue  # a system or imported library
            g = top_folder(graph[dep][1])
            if g == f or g == "":
                continue
            if g not in floors:
                out.append(f"{name} ({f}/) links {dep} ({g}/), which has no floor")
            elif floors[g] >= floors[f]:
                where = "a higher floor" if floors[g] > floors[f] else "a peer on its floor"
                out.append(f"{name} ({f}/, floor {floors[f]}) links {dep} ({g}/, floor "
                           f"{floors[g]}): {where}")
    return out


def include_violations(rel_path, lines, floors):
    f = top_folder(rel_path)
    out = []
    for n, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if not m or "/" not in m.group(1):
            continue
        inc = m.group(1)
        g = "proto" if inc.startswith(("conveyor/", "tensorflow/")) else top_folder(inc)
        if g not in floors or g == f:
            continue
        if floors[g] >= floors[f]:
            where = "a higher floor" if floors[g] > floors[f] else "a peer on its floor"
            out.append(f"{rel_path}:{n}: includes {inc} ({g}/, floor {floors[g]}) from {f}/ "
                       f"(floor {floors[f]}): {where}")
    return out


def control(floors):
    """The checks must catch a made-up upward link and a made-up upward include."""
    fake = {
        "low": ("STATIC_LIBRARY", "storage", ["high"]),
        "high": ("STATIC_LIBRARY", "pipeline", ["low"]),
    }
    found = link_violations(fake, floors)
    if len(found) != 1 or "low (storage/" not in found[0]:
        raise SystemExit(f"FAIL: control: an upward link was not reported as one: {found}")
    found = include_violations("storage/x.cc", ['#include "pipeline/pipeline.h"',
                                                '#include "base/strings.h"'], floors)
    if len(found) != 1:
        raise SystemExit(f"FAIL: control: an upward include was not reported as one: {found}")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    root, graph_path = sys.argv[1], sys.argv[2]
    floors = read_floors(os.path.join(root, "cmake", "floors.txt"))
    control(floors)

    graph = read_graph(graph_path)
    libraries = [n for n, (t, _, _) in graph.items() if t.endswith("_LIBRARY")]
    for must in ("conveyor_base", "conveyor_storage", "conveyor_pipeline", "conveyor_client"):
        if must not in graph:
            raise SystemExit(f"FAIL: {graph_path} has no {must}: not the link graph of this tree")
    failures = link_violations(graph, floors)

    files = 0
    for folder in sorted(floors):
        base = os.path.join(root, folder)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, errors="replace") as f:
                    lines = f.read().splitlines()
                files += 1
                failures += include_violations(os.path.relpath(path, root), lines, floors)
    # A top-level folder with sources but no floor is a new floor someone has to place.
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry)
        if entry in floors or entry.startswith(".") or not os.path.isdir(path):
            continue
        if os.path.exists(os.path.join(path, "CMakeLists.txt")):
            failures.append(f"{entry}/ has a CMakeLists.txt but no floor in cmake/floors.txt")

    for line in failures:
        print("FAIL:", line)
    if failures:
        print(f"{len(failures)} upward dependencies; floors (lowest first): "
              + " < ".join("/".join(sorted(k for k, v in floors.items() if v == lvl))
                           for lvl in sorted(set(floors.values()))))
        return 1
    print(f"floors: {len(libraries)} libraries and {files} source files checked against "
          f"cmake/floors.txt; every link and include points down (control caught an upward "
          f"link and include)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
