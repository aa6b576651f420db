"""Short names for one-line views (memhook/common/short_names.py): demangled names as libstdc++,
libc++ and Boost-style templates give them, and the short form a person reads."""
from __future__ import annotations

import pytest

from memhook.common.short_names import Shortener, short

STRING = "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >"


@pytest.mark.parametrize("full,expected", [
    (f"{STRING}::_M_mutate(unsigned long, unsigned long, char const*, unsigned long)",
     "std::string::_M_mutate"),
    (f"{STRING}::append(char const*, unsigned long)", "std::string::append"),
    ("std::__cxx11::basic_string<wchar_t, std::char_traits<wchar_t>, std::allocator<wchar_t> "
     ">::reserve(unsigned long)", "std::wstring::reserve"),
    ("void std::vector<Session, std::allocator<Session> >::_M_realloc_insert<Session>"
     "(__gnu_cxx::__normal_iterator<Session*, std::vector<Session, std::allocator<Session> > "
     ">, Session&&)", "std::vector<Session>::_M_realloc_insert"),
    (f"std::vector<{STRING}, std::allocator<{STRING} > >::push_back({STRING} const&)",
     "std::vector<std::string>::push_back"),
    (f"std::_Rb_tree<int, std::pair<int const, {STRING} >, std::_Select1st<std::pair<int const, "
     f"{STRING} > >, std::less<int>, std::allocator<std::pair<int const, {STRING} > > >::"
     "_M_get_node()",
     "std::_Rb_tree<int, std::pair<int const, std::string>, std::_Select1st<std::pair<int "
     "const, std::string>>, std::less<int>, std::allocator<std::pair<int const, "
     "std::string>>>::_M_get_node"),
    (f"std::map<int, {STRING}, std::less<int>, std::allocator<std::pair<int const, {STRING} > > "
     ">::operator[](int const&)", "std::map<int, std::string>::operator[]"),
    ("std::set<long, std::less<long>, std::allocator<long> >::insert(long const&)",
     "std::set<long>::insert"),
    ("std::unordered_map<int, double, std::hash<int>, std::equal_to<int>, "
     "std::allocator<std::pair<int const, double> > >::operator[](int const&)",
     "std::unordered_map<int, double>::operator[]"),
    ("std::unique_ptr<Node, std::default_delete<Node> >::reset(Node*)",
     "std::unique_ptr<Node>::reset"),
    ("std::basic_ostream<char, std::char_traits<char> >& std::operator<< <std::char_traits<"
     "char> >(std::basic_ostream<char, std::char_traits<char> >&, char const*)",
     "std::operator<<"),
    ("std::__1::basic_string<char, std::__1::char_traits<char>, std::__1::allocator<char> "
     ">::__grow_by(unsigned long, unsigned long)", "std::string::__grow_by"),
    ("boost::container::vector<int, boost::container::new_allocator<int>, void>::"
     "priv_forward_range_insert(int*, unsigned long)",
     "boost::container::vector<int, boost::container::new_allocator<int>, void>::"
     "priv_forward_range_insert"),
    ("(anonymous namespace)::pool::pool()", "(anonymous namespace)::pool::pool"),
    ("remember_session(int)", "remember_session"),
    ("keep_strdup(int) [clone .constprop.0]", "keep_strdup"),
    ("Handler::operator()(Request const&) const", "Handler::operator()"),
    ("main::{lambda(int)#1}::operator()(int) const", "main::{lambda(int)#1}::operator()"),
    ("void (*std::function<void (int)>::target<void (*)(int)>())(int)",
     "std::function<void (int)>::target"),
    ("std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > "
     "std::operator+<char, std::char_traits<char>, std::allocator<char> >(std::__cxx11::"
     "basic_string<char, std::char_traits<char>, std::allocator<char> >&&, char const*)",
     "std::operator+"),
    ("bool operator< <int>(Box<int> const&, Box<int> const&)", "operator<"),
    ("main", "main"),
])
def test_short_names(full, expected):
    assert short(full) == expected


def test_overloads_keep_their_parameters():
    names = ["parse(char const*)", f"parse({STRING} const&)", "other(int)"]
    s = Shortener(names)
    assert s(names[0]) == "parse(char const*)"
    assert s(names[1]) == "parse(std::string const&)"
    assert s(names[2]) == "other"
    assert Shortener(names, full=True)(names[1]) == names[1]
