#!/usr/bin/env python3
"""Checks that the source tree follows the component graph below.

   scripts/check_layering.py [SOURCE_DIR]       (ctest: layering_test)

Every `#include "..."` of a project header must go from a component to itself or to a component
it depends on (DEPENDS_ON, followed transitively). A header named in DEPENDS_ON
(`replay/inspect.h`) allows that one header of its folder and nothing else there. Every strider_*
library in a target_link_libraries() of a strider_* library must hold a component in reach of
the linking one (a library may hold several folders, as strider_learner holds the core and
pretrain/). A source folder that is not in the table is an error too, so a new component has to
be placed in the graph. Reads sources only (no build tree) and takes well under a second. Exit 1
with one line per violation, 0 when the tree follows the graph.
"""
import os
import re
import sys

# Component (a folder, with its subfolders unless they are components of their own) -> the
# components it may include and link directly. Folders are matched longest first.
DEPENDS_ON = {
    'common': [],
    # The raw CUDA kernels sit below the ATen ones: decode on a GPU calls them with tensor data.
    'common/kernels': ['common', 'common/kernels/cuda'],
    'common/kernels/cuda': ['common'],
    'common/schema': ['common'],
    'common/transport': ['common', 'common/schema'],
    'common/model': ['common', 'common/kernels'],
    'envs': ['common'],
    'report': ['common'],
    'replay/samplers': ['common'],
    'replay': ['common', 'common/schema', 'common/transport', 'replay/samplers'],
    # Rewards read stored trajectories and replay episodes; of replay only the clients and the
    # read-only store reader, and never the learner (trained reward models are in learner/prm).
    'reward': ['common', 'common/schema', 'envs', 'replay/client.h', 'replay/inspect.h'],
    'rollout_engine': ['common', 'common/model'],
    'actors': ['common', 'common/schema', 'common/transport', 'common/model', 'envs', 'replay',
               'rollout_engine'],
    # The learner's training core: the chunked pass, optimiser, checkpoints, the loss. It knows
    # no data pipeline, reward or replay code; the folders below build on it.
    'learner': ['common', 'common/model'],
    'learner/pretrain/data': ['common', 'common/schema', 'envs'],
    'learner/pretrain': ['learner', 'learner/pretrain/data', 'report', 'envs'],
    'learner/prm': ['learner', 'reward', 'common/schema', 'envs', 'replay/inspect.h'],
    'learner/rl': ['learner', 'learner/prm', 'reward', 'common/schema', 'common/transport',
                   'replay/client.h', 'replay/inspect.h'],
    # The launcher supervises `strider` processes and reads their files: no learner, no LibTorch.
    'launcher': ['common', 'common/transport', 'report'],
    # The binary wires every component together.
    'cli': ['actors', 'envs', 'launcher', 'learner/pretrain', 'learner/prm', 'learner/rl',
            'replay', 'report', 'reward', 'rollout_engine'],
    'bench': ['actors', 'cli', 'envs', 'launcher', 'learner/pretrain', 'learner/prm',
              'learner/rl', 'replay', 'report', 'reward', 'rollout_engine', 'common/kernels/cuda',
              'tests'],
    'tests': ['actors', 'cli', 'envs', 'launcher', 'learner/pretrain', 'learner/prm',
              'learner/rl', 'replay', 'report', 'reward', 'rollout_engine', 'common/kernels/cuda'],
}

# Folders with no C++ sources of the project's own.
NOT_SOURCE = {'.ci', '.git', '.ccache', 'build', 'cmake', 'configs', 'docs', 'scripts'}
SOURCE_SUFFIXES = ('.h', '.cc', '.cu', '.cuh')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

COMPONENTS = sorted(DEPENDS_ON, key=len, reverse=True)
FOLDERS = {c.split('/')[0] for c in DEPENDS_ON}


def not_source(root, folder):
    """Top-level folders that hold no project sources: docs, scripts, build trees (build-asan/)."""
    return (folder in NOT_SOURCE or folder.startswith('.') or folder.startswith('build') or
            os.path.exists(os.path.join(root, folder, 'CMakeCache.txt')))


def component_of(path):
    for c in COMPONENTS:
        if path == c or path.startswith(c + '/'):
            return c
    return None


def closure(component):
    """Everything `component` may reach: its dependencies and theirs, folders and headers."""
    seen, stack = set(), list(DEPENDS_ON[component])
    while stack:
        d = stack.pop()
        if d in seen:
            continue
        seen.add(d)
        stack.extend(DEPENDS_ON.get(d, []))
    return seen


ALLOWED = {c: closure(c) | {c} for c in DEPENDS_ON}


def allowed(source_component, target_path):
    """Whether a file of source_component may include (or link) target_path."""
    target = component_of(target_path)
    reach = ALLOWED[source_component]
    return target in reach or target_path in reach


def check_table(errors):
    for c, deps in DEPENDS_ON.items():
        for d in deps:
            if d not in DEPENDS_ON and component_of(d) not in DEPENDS_ON:
                errors.append(f'check_layering.py: {c} depends on {d}, which is not in the table')
        if c in closure(c):
            errors.append(f'check_layering.py: {c} depends on itself through {sorted(deps)}')


def check_includes(root, errors):
    files = 0
    for folder in sorted(os.listdir(root)):
        top = os.path.join(root, folder)
        if not os.path.isdir(top) or not_source(root, folder):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, '/')
                source = component_of(path)
                if source is None:
                    errors.append(f'{path}: folder {folder}/ is not in the component table of '
                                  'scripts/check_layering.py')
                    break
                files += 1
                with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if target.split('/')[0] not in FOLDERS:
                            continue  # a third-party header, or one beside the file
                        if not allowed(source, target):
                            errors.append(f'{path}:{number}: {source} includes "{target}" '
                                          f'({component_of(target)}), which it does not depend on')
    return files


def cmake_calls(text, command):
    """(first argument, other arguments) of every `command(...)` call in a CMakeLists text."""
    text = re.sub(r'#[^\n]*', '', text)
    for m in re.finditer(r'\b' + command + r'\s*\(([^)]*)\)', text):
        words = m.group(1).split()
        if words:
            yield words[0], words[1:]


def check_links(root, errors):
    libraries = {}  # strider_* library -> the components of its sources
    links = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root).replace(os.sep, '/')
        if rel != '.' and not_source(root, rel.split('/')[0]):
            dirnames[:] = []
            continue
        if 'CMakeLists.txt' not in filenames:
            continue
        with open(os.path.join(dirpath, 'CMakeLists.txt'), encoding='utf-8') as f:
            text = f.read()
        base = '' if rel == '.' else rel + '/'
        for name, args in cmake_calls(text, 'add_library'):
            sources = [a for a in args if a.endswith(SOURCE_SUFFIXES)]
            units = {component_of(base + s) for s in sources} or {component_of(rel)}
            libraries[name] = {u for u in units if u}
        for name, args in cmake_calls(text, 'target_link_libraries'):
            links.append((rel + '/CMakeLists.txt', name, args))
    for where, name, args in links:
        if name not in libraries:
            continue  # an executable: the binary, a test or a benchmark
        for lib in args:
            if not lib.startswith('strider_') or lib not in libraries or lib == name:
                continue
            # A library holds whole folders (strider_learner: the core and pretrain/), so a link
            # needs only one of them in reach; a header named in the table reaches its folder.
            reach = {component_of(r) for source in libraries[name] for r in ALLOWED[source]}
            if not libraries[lib] & reach:
                errors.append(f'{where}: {name} ({", ".join(sorted(libraries[name]))}) links '
                              f'{lib} ({", ".join(sorted(libraries[lib]))}), which it does not '
                              'depend on')
    return len(libraries)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), '..'))
    errors = []
    check_table(errors)
    files = check_includes(root, errors)
    libraries = check_links(root, errors)
    for e in errors:
        print(e)
    if files == 0:
        print(f'check_layering.py: no sources under {root}')
        return 1
    print(f'check_layering.py: {files} files, {libraries} libraries, '
          f'{len(errors)} violations')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
