// The shared library of tests/targets/heap_census.cpp: a polymorphic class whose vtable (and so
// whose type, in the census) belongs to this library, not to the executable.
namespace shapes {
struct Plugin {
  virtual ~Plugin() {}
  virtual int id() const { return 3; }
  long state[6];
};
Plugin* make_plugin() { return new Plugin(); }
void drop_plugin(Plugin* p) { delete p; }
}  // namespace shapes
