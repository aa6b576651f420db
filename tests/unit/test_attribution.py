"""The leak's own frame (memhook/common/attribution.py): which frame a person would fix, and the
qualified name its rules match, whatever the demangler put around it."""
from __future__ import annotations

import pytest

from memhook.common import attribution
from memhook.common.format import leak_site


def f(function, module="/opt/app/app", inlined=False):
    return {"function": function, "module": module, "file": None, "line": None,
            "inlined": inlined}


LIBSTDCXX = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.parametrize("demangled,qualified", [
    ("void std::vector<Session, std::allocator<Session> >::_M_realloc_insert<Session>"
     "(__gnu_cxx::__normal_iterator<Session*, std::vector<Session> >, Session&&)",
     "std::vector<Session, std::allocator<Session> >::_M_realloc_insert<Session>"),
    ("std::shared_ptr<std::enable_if<!std::is_array<Session>::value, Session>::type> "
     "std::make_shared<Session>()", "std::make_shared<Session>"),
    ("operator new(unsigned long)", "operator new"),
    ("operator delete[](void*)", "operator delete[]"),
    ("std::operator<<(std::ostream&, char const*)", "std::operator<<"),
    ("bool std::operator< <int>(std::pair<int, int> const&, std::pair<int, int> const&)",
     "std::operator< <int>"),
    ("foo::operator()(int) const", "foo::operator()"),
    ("{lambda(int)#1}::operator()(int) const", "{lambda(int)#1}::operator()"),
    ("(anonymous namespace)::pool::pool()", "(anonymous namespace)::pool::pool"),
    ("unsigned long foo<3>(int)", "foo<3>"),
    ("std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > "
     "std::operator+<char, std::char_traits<char>, std::allocator<char> >(std::__cxx11::"
     "basic_string<char, std::char_traits<char>, std::allocator<char> >&&, char const*)",
     "std::operator+<char, std::char_traits<char>, std::allocator<char> >"),
    ("bool operator==<int>(Box<int> const&, Box<int> const&)", "operator==<int>"),
    ("main", "main"),
])
def test_qualified_name(demangled, qualified):
    assert attribution.qualified_name(demangled) == qualified


def test_attributed_frame():
    inlined_std = [f("void std::vector<int, std::allocator<int> >::_M_realloc_insert<int>(x)",
                     inlined=True), f("grow_table(int)"), f("main")]
    assert attribution.attributed(inlined_std) == 1
    through_libstdcxx = [f("operator new(unsigned long)", LIBSTDCXX),
                         f("std::__cxx11::basic_string<char, std::char_traits<char>, "
                           "std::allocator<char> >::_M_mutate(unsigned long)", LIBSTDCXX),
                         f("remember_session(int)"), f("main")]
    assert attribution.attributed(through_libstdcxx) == 2
    static_jemalloc = [f("je_malloc"), f("je_mallocx"), f("handle_request"), f("main")]
    assert attribution.attributed(static_jemalloc) == 2
    marker = [f("[no unwind info]", None)]
    assert attribution.attributed([f("strdup", LIBC)] + marker + [f("keep")]) == 2
    all_runtime = [f(None, LIBSTDCXX), f("call_init", "/lib64/ld-linux-x86-64.so.2")]
    assert attribution.attributed(all_runtime) == 0
    unknown_in_program = [f(None, "/opt/app/app"), f("main")]
    assert attribution.attributed(unknown_in_program) == 0
    # Allocation wrappers of known programs: their callers (Redis through zmalloc, GLib,
    # PostgreSQL's palloc, ClickHouse's Allocator<>), not a program function called malloc_x.
    redis = [f("zmalloc_usable", "/usr/bin/redis-server"), f("_sdsnewlen"), f("main")]
    assert attribution.attributed(redis) == 1
    glib = [f("g_malloc", "/usr/lib/libglib-2.0.so.0"), f("g_strdup", "/usr/lib/libglib-2.0.so.0"),
            f("load_config"), f("main")]
    assert attribution.attributed(glib) == 2
    postgres = [f("AllocSetAlloc"), f("palloc"), f("pstrdup"), f("ExecInitNode")]
    assert attribution.attributed(postgres) == 3
    clickhouse = [f("Allocator<false, false>::alloc(unsigned long, unsigned long)"),
                  f("DB::PODArrayBase<1ul, 4096ul, Allocator<false, false>, 63ul, 64ul>::"
                    "realloc<>(unsigned long)")]
    assert attribution.attributed(clickhouse) == 1
    assert attribution.attributed([f("xmalloc_table"), f("main")]) == 0
    jvm = "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"  # HotSpot's C heap, arenas
    hotspot = [f("os::malloc(unsigned long, MEMFLAGS, NativeCallStack const&)", jvm),
               f("AllocateHeap(unsigned long, MEMFLAGS, AllocFailStrategy::AllocFailEnum)", jvm),
               f("OopMapCache::OopMapCache()", jvm)]
    assert attribution.attributed(hotspot) == 2
    arena = [f("os::malloc(unsigned long, MEMFLAGS)", jvm),
             f("ChunkPool::allocate(unsigned long, AllocFailStrategy::AllocFailEnum)", jvm),
             f("Arena::grow(unsigned long, AllocFailStrategy::AllocFailEnum)", jvm),
             f("Arena::Arealloc(void*, unsigned long, unsigned long)", jvm),
             f("LinearScan::build_intervals()", jvm)]
    assert attribution.attributed(arena) == 4
    mine = attribution.Rules.with_user(functions=["remember_*"], modules=["app"])
    assert attribution.attributed(through_libstdcxx, mine) == 0  # all runtime now


def test_one_line_leads_with_the_attributed_frame_then_the_path():
    stack = [f("operator new(unsigned long)", LIBSTDCXX),
             f("std::__cxx11::basic_string<char>::_M_mutate(unsigned long)", LIBSTDCXX),
             f("std::__cxx11::basic_string<char>::append(char const*)", LIBSTDCXX),
             {**f("remember_session(int)"), "file": "leaky_service.cpp", "line": 22}]
    assert leak_site({"frames": stack}) == (
        "remember_session  leaky_service.cpp:22  (via std::string::_M_mutate <- "
        "std::string::append)")
