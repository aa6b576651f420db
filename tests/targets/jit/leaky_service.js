// A command-driven Node.js service (tests/integration/test_jit_frames.py): each line makes
// leakyHandler keep 100 Buffers of 5000 to 5002 bytes; "exit" ends it. Run with
// --perf-basic-prof, which writes /tmp/perf-PID.map.
const held = [];
function leakyHandler(n) {
  for (let i = 0; i < n; i++) held.push(Buffer.alloc(5000 + i % 3));
}
process.stdout.write("ready\n");
require("readline").createInterface({input: process.stdin}).on("line", (line) => {
  if (line === "exit") process.exit(0);
  leakyHandler(100);
  process.stdout.write("done\n");
});
