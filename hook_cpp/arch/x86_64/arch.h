// What the C++ code needs of an x86-64 processor, in one place (the seam: another processor is a
// folder beside this one with the same names). The hand-written malloc entry (malloc_entry.S)
// and the leak check's syscall stub (syscall_stub.S) are this folder's too; the offsets they
// read come from hook_library/asm_offsets.cpp.
#pragma once
#include <cpuid.h>
#include <elf.h>
#include <stdint.h>
#include <x86intrin.h>

#include "slot_relocations.h"
#include "unwind_rows.h"

namespace memhook {
namespace arch {

// malloc's every-call entry is written by hand here (malloc_entry.S: the recent stack compared
// with SSE4.1 or AVX-512); a processor without one gets the compiled hook (entry_points.h).
#define MEMHOOK_MALLOC_ENTRY 1
// The symbol version of glibc's first release for this processor: what the library binds its
// versioned imports to (hook_library/glibc_baseline.h).
#define MEMHOOK_GLIBC_FIRST "GLIBC_2.2.5"

constexpr int kElfMachine = EM_X86_64;  // the e_machine of the objects this build handles
constexpr const char* kName = "x86-64";

// The cycle counter the hooks stamp clock records with (an invariant TSC: memhook checks
// constant_tsc and nonstop_tsc before choosing it).
inline uint64_t cycles() { return __rdtsc(); }

// The same counter read where no earlier or later instruction may pass it (the consumer's
// anchors, which must not be read ahead of the write cursor they date).
inline uint64_t cycles_ordered() {
  unsigned aux;
  _mm_lfence();
  uint64_t t = __rdtscp(&aux);
  _mm_lfence();
  return t;
}

// Sampling's countdown: subtract `size` from `left`; true while bytes remain. One
// read-modify-write instruction whose flags answer (a signed "greater": the same as the
// subtraction's result > 0 for any countdown and size below 2^62).
inline bool count_down(int64_t& left, uint64_t size) {
  bool more;
  asm("subq %2, %0" : "+m"(left), "=@ccg"(more) : "er"(size) : "cc");
  return more;
}

// What the hand-written entry needs (it compares with ptest, SSE4.1), and whether the
// comparison's AVX-512 sequence (vpternlogq: AVX-512F and VL, the kernel keeping their state)
// may run. False: the hooks cannot run on this processor.
inline bool cpu_supported(bool* avx512) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_SSE4_1)) return false;
  unsigned xcr0 = 0, xcr0_hi;
  if (ecx & bit_OSXSAVE) asm("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));
  *avx512 = (xcr0 & 0xe6) == 0xe6 && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
            (ebx & bit_AVX512F) && (ebx & bit_AVX512VL);
  return true;
}

// The bytes of the XSAVE area for every feature the kernel enabled (CPUID leaf 0xD, EBX): what a
// debugger must pass, whole, to write a thread's extended registers (PTRACE_SETREGSET,
// NT_X86_XSTATE). GDB before 14 passes at most 2696 bytes: too few once the kernel enables AMX's
// tiles (memhook/inject/gdb_xstate.py).
inline uint32_t xsave_bytes() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid_count(0xD, 0, &eax, &ebx, &ecx, &edx) ? ebx : 0;
}

// ucontext_t (a signal frame): the interrupted frame pointer, stack pointer and program counter
// in uc_mcontext.gregs (REG_RBP, REG_RSP, REG_RIP).
constexpr uint64_t kUcFramePointer = 40 + 8 * 10, kUcStackPointer = 40 + 8 * 15,
                   kUcProgramCounter = 40 + 8 * 16;

// A thread's general registers as PTRACE_GETREGSET (NT_PRSTATUS) gives them (user_regs_struct):
// the leak check takes each as a possible pointer, and the stack pointer says where the live part
// of its stack begins. Below it the ABI's red zone may still hold a leaf function's data.
constexpr int kRegsStackPointer = 19;  // rsp
// The thread pointer (fs_base), where glibc's thread control block begins; its dtv field, the
// pointer to the thread's dynamic thread vector (tcbhead_t: tcb, dtv, self...).
constexpr int kRegsThreadPointer = 21;  // fs_base
constexpr unsigned kThreadPointerRegset = 0;  // (among those registers: no regset of its own)
constexpr uint64_t kTcbDtvOffset = 8;
constexpr uint64_t kStackRedZone = 128;

// User-space addresses fit in 47 bits (4-level paging; 5-level gives more only to a program
// that asks): a ring's pointer words keep a frame's depth above them (record_format.h).
constexpr int kUserAddressBits = 47;
// A system call a stopped thread is made to run (reachability/forked_image.h): where its number,
// arguments and result go among those registers, and the program counter. orig_rax set to -1:
// the kernel must not restart, on the way out of the stop, a call the thread was interrupted in.
constexpr int kRegsProgramCounter = 16;  // rip
constexpr int kRegsSyscallNumber = 10;   // rax, and the result
constexpr int kRegsSyscallResult = 10;
constexpr int kRegsRestartNumber = 15;   // orig_rax
constexpr int kRegsSyscallArgs[] = {14, 13, 12, 7, 9, 8};  // rdi, rsi, rdx, r10, r8, r9
inline void no_restart(uint64_t* regs) { regs[kRegsRestartNumber] = ~uint64_t(0); }
// Control::call_regs' words: user_regs_struct's 27, with room to spare. The stub's stack below
// the thread's sp (its return, under the red zone), and a thread the stub may run on: any.
constexpr int kCallRegs = 32;
constexpr uint64_t kStubStackBytes = 4096;
inline bool restarts_from_scratch(const uint64_t* /*regs*/) { return false; }  // (as_resumed)
// Constants of this processor's own that its assembly reads (asm_offsets.cpp prints them).
struct AsmConstant {
  const char* name;
  long long value;
  const char* why;
};
constexpr AsmConstant kAsmConstants[] = {{"RED_ZONE", 128, "the ABI's red zone below rsp"}};

// The registers a thread stopped in signal delivery goes on with when it takes no signal: a
// system call it was interrupted in restarts (-ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND:
// the call again; -ERESTART_RESTARTBLOCK: restart_syscall), as the kernel's
// arch_do_signal_or_restart does; `syscall` is two bytes. The syscall stub returns to these.
inline void as_resumed(uint64_t* regs) {
  const int64_t nr = int64_t(regs[kRegsRestartNumber]), ret = int64_t(regs[kRegsSyscallNumber]);
  if (nr < 0 || ret < -516 || ret > -512 || ret == -515) return;
  regs[kRegsSyscallNumber] = ret == -516 ? 219 : uint64_t(nr);  // (219: restart_syscall)
  regs[kRegsProgramCounter] -= 2;
}
// The bits of a word that can be an address (no pointer tags on x86-64).
constexpr uint64_t kPointerBits = ~uint64_t(0);

// The relocations that store a function's address in a slot memhook patches: JUMP_SLOT,
// GLOB_DAT, and an absolute 64-bit one with no addend (a function pointer in data). The one
// list: the hook library's late patching reads it here, memhook's scan through the consumer
// module (memhook/common/arch.py).
constexpr SlotRelocation kSlotRelocations[] = {{R_X86_64_JUMP_SLOT, "JUMP_SLOT", false},
                                               {R_X86_64_GLOB_DAT, "GLOB_DAT", false},
                                               {R_X86_64_64, "R_X86_64_64", true}};

// DWARF register numbers (the psABI's): rbp, rsp, and the return address column.
constexpr int kDwarfFramePointer = 6, kDwarfStackPointer = 7, kDwarfReturnAddress = 16;

// Where an unwind row's return address is, in words below its CFA (common/unwind_rows.h):
// `call` pushed it right below the caller's stack pointer, always. ra_rule: whether CFI's
// "return address at CFA - 8 * ra" fits a row with this rbp rule and slot (unwind/cfi_rows.cpp).
constexpr uint32_t ra_slot(uint32_t /*rule*/) { return 1; }
inline bool ra_rule(int64_t ra, RbpRule* /*rbp*/, uint32_t* /*slot*/) { return ra == 1; }
// No link register: a return address is always on the stack (ra_slot never says 0).
inline bool ra_in_register(RbpRule* /*rbp*/, uint32_t* /*slot*/) { return false; }
constexpr uint64_t kUcLinkRegister = 0;
// The ucontext of a signal frame, from the stack pointer at the signal trampoline
// (__restore_rt: `ret` popped pretcode, the ucontext follows).
constexpr uint64_t kSignalUcontext = 0;
// A return address as stored: here, just that.
inline uint64_t return_address(uint64_t stored) { return stored; }

// A frame-pointer frame (push rbp; mov rsp, rbp): CFA = rbp + 16, rbp saved at CFA - 16, the
// return address above it. Its two words are one pair of the malloc entry's comparison.
constexpr bool frame_record_row(uint32_t r) {
  return cfa_offset(r) == 16 && rbp_rule(r) == kRbpSaved && rbp_slot(r) == 2;
}

// The malloc entry's pair comparison this CPU runs (malloc_entry.S): AVX-512's or SSE4.1's,
// from its first step to its last.
extern "C" const char memhook_compare_sse[], memhook_compare_sse_last[], memhook_compare_avx512[],
    memhook_compare_avx512_last[];
inline void pair_steps(bool avx512, const char** first, const char** last) {
  *first = avx512 ? memhook_compare_avx512 : memhook_compare_sse;
  *last = avx512 ? memhook_compare_avx512_last : memhook_compare_sse_last;
}

}  // namespace arch
}  // namespace memhook
