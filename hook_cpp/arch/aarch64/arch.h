// What the C++ code needs of an AArch64 processor: the same names as arch/x86_64/arch.h (issue 46).
//
// Beside it: malloc_entry.S (malloc's every-call entry, by hand), syscall_stub.S (a system call
// a stopped thread makes for the leak check), hook_frame.h (where a hook was called from),
// cell_code.h (an entry patch's B and stub), plt_rows.h.
#pragma once
#include <elf.h>
#include <stddef.h>
#include <stdint.h>
#include <ucontext.h>
#if defined(__aarch64__)  // (the kernel's signal frame records, for the checks below; musl's
#ifdef __GLIBC__          // signal.h declares them itself)
#include <asm/sigcontext.h>
#endif
#include <signal.h>
#endif

#include "slot_relocations.h"
#include "unwind_rows.h"

namespace memhook {
namespace arch {

// malloc's every-call entry is written by hand here (malloc_entry.S: the recent stack compared
// in unrolled steps, as on x86-64).
#define MEMHOOK_MALLOC_ENTRY 1
// The symbol version of glibc's first release for this processor (hook_library/
// glibc_baseline.h).
#define MEMHOOK_GLIBC_FIRST "GLIBC_2.17"

constexpr int kElfMachine = EM_AARCH64;  // the e_machine of the objects this build handles
constexpr const char* kName = "aarch64";

// The generic timer's virtual count (CNTVCT_EL0), readable from user space on Linux; constant
// rate (CNTFRQ_EL0), so memhook's calibration against CLOCK_MONOTONIC holds as for an invariant
// TSC.
inline uint64_t cycles() {
  uint64_t t;
  asm volatile("mrs %0, cntvct_el0" : "=r"(t));
  return t;
}

// The same counter read where no earlier or later instruction may pass it (the consumer's
// anchors, which must not be read ahead of the write cursor they date): the counter read is not
// ordered by the memory model, so an instruction barrier on each side.
inline uint64_t cycles_ordered() {
  uint64_t t;
  asm volatile("isb\n\tmrs %0, cntvct_el0\n\tisb" : "=r"(t) : : "memory");
  return t;
}

// Sampling's countdown: subtract `size` from `left`; true while bytes remain (the same as the
// subtraction's result > 0 for any countdown and size below 2^62). No read-modify-write
// instruction on memory here: the compiler's load, subtract and compare.
inline bool count_down(int64_t& left, uint64_t size) {
  left -= int64_t(size);
  return left > 0;
}

// Nothing beyond the base architecture is needed; there is no AVX-512 comparison here.
inline bool cpu_supported(bool* avx512) {
  *avx512 = false;
  return true;
}

// No XSAVE area: a debugger writes the FP/SIMD registers with NT_PRFPREG, a fixed size.
inline uint32_t xsave_bytes() { return 0; }

// ucontext_t (a signal frame): the interrupted frame pointer (x29), stack pointer and program
// counter in uc_mcontext (struct sigcontext: fault_address, regs[31], sp, pc).
constexpr uint64_t kUcFramePointer = 184 + 8 * 29, kUcStackPointer = 184 + 8 * 31,
                   kUcProgramCounter = 184 + 8 * 32;
#if defined(__aarch64__)  // (checked where the headers are AArch64's: a cross build, the guest)
static_assert(offsetof(ucontext_t, uc_mcontext.regs[29]) == kUcFramePointer);
static_assert(offsetof(ucontext_t, uc_mcontext.sp) == kUcStackPointer);
static_assert(offsetof(ucontext_t, uc_mcontext.pc) == kUcProgramCounter);
#endif

// A thread's general registers as PTRACE_GETREGSET (NT_PRSTATUS) gives them (user_pt_regs:
// x0-x30, sp, pc, pstate). No red zone in the AAPCS64: nothing below sp is live.
constexpr int kRegsStackPointer = 31;
constexpr int kRegsProgramCounter = 32;
constexpr uint64_t kStackRedZone = 0;

// User-space addresses fit in 48 bits (Linux's 48-bit VA; 52-bit only for a program that asks):
// Debian's arm64 programs load at 0xaaaa..., bit 47 set, so 47 bits lose it.
constexpr int kUserAddressBits = 48;
// The thread pointer (TPIDR_EL0) is not among them: get_regs (reachability/thread_stop.h) reads
// it with its own regset and keeps it after them, at this index. glibc's thread control block
// begins there (TLS variant I: tcbhead_t is dtv, private), its dtv pointer first.
constexpr int kRegsThreadPointer = 34;
constexpr unsigned kThreadPointerRegset = 0x401;  // NT_ARM_TLS
constexpr uint64_t kTcbDtvOffset = 0;
// A system call a stopped thread is made to run: its number in x8, arguments in x0-x5, the
// result in x0.
constexpr int kRegsSyscallNumber = 8;
constexpr int kRegsSyscallResult = 0;
constexpr int kRegsSyscallArgs[] = {0, 1, 2, 3, 4, 5};
// The leak check's copy of the process (forked_image.h): the stub (syscall_stub.S) puts every
// register back through rt_sigreturn, from a signal frame it writes below the thread's sp
// (4688 bytes). A thread stopped in a system call the kernel restarts was already set to
// restart before its stop (the kernel's do_signal rewinds pc to the svc and puts x0 back), and
// the restart it would decide after the stop is skipped for the stub's pc: nothing to undo or
// redo, but for a call that restarts through restart_syscall (-ERESTART_RESTARTBLOCK: relative
// sleeps and waits), which would run again from scratch. Its return value, which says so, is
// gone by the stop, so a thread whose x8 names such a call is not made to make the stub's.
inline void no_restart(uint64_t* /*regs*/) {}
inline void as_resumed(uint64_t* /*regs*/) {}
constexpr int kCallRegs = 34;  // user_pt_regs: x0-x30, sp, pc, pstate
constexpr uint64_t kStubStackBytes = 8192;
// The signal frame syscall_stub.S writes for rt_sigreturn (struct rt_sigframe: a siginfo, then
// the ucontext; in uc_mcontext.__reserved the FP/SIMD record the kernel requires, then the
// terminator), for asm_offsets.cpp to print.
struct AsmConstant {
  const char* name;
  long long value;
  const char* why;
};
constexpr uint64_t kSiginfoBytes = 128, kUcStack = 16, kUcSigmask = 40, kUcRegs = 184,
                   kUcReserved = 464, kUcontextBytes = 4560, kFpsimdMagic = 0x46508001,
                   kFpsimdBytes = 528;
constexpr AsmConstant kAsmConstants[] = {
    {"SIGFRAME_BYTES", kSiginfoBytes + kUcontextBytes, "struct rt_sigframe"},
    {"SIGINFO_BYTES", kSiginfoBytes, "the ucontext, from the frame"},
    {"UC_STACK", kUcStack, "uc_stack (sigaltstack's)"},
    {"UC_SIGMASK", kUcSigmask, "uc_sigmask"},
    {"UC_REGS", kUcRegs, "uc_mcontext.regs: x0-x30, then sp, pc, pstate"},
    {"UC_RESERVED", kUcReserved, "uc_mcontext.__reserved: the records"},
    {"FPSIMD_MAGIC", kFpsimdMagic, "struct fpsimd_context's"},
    {"FPSIMD_BYTES", kFpsimdBytes, "its size: head, fpsr, fpcr, v0-v31"}};
#if defined(__aarch64__)
static_assert(FPSIMD_MAGIC == kFpsimdMagic && sizeof(fpsimd_context) == kFpsimdBytes);
static_assert(sizeof(siginfo_t) == kSiginfoBytes && sizeof(ucontext_t) == kUcontextBytes);
static_assert(offsetof(ucontext_t, uc_stack) == kUcStack &&
              offsetof(ucontext_t, uc_sigmask) == kUcSigmask &&
              offsetof(ucontext_t, uc_mcontext.regs) == kUcRegs &&
              offsetof(ucontext_t, uc_mcontext.__reserved) == kUcReserved);
#endif
inline bool restarts_from_scratch(const uint64_t* regs) {
  const uint64_t nr = regs[kRegsSyscallNumber];
  constexpr uint64_t kNanosleep = 101, kClockNanosleep = 115, kPpoll = 73, kPselect6 = 72,
                     kFutex = 98, kFutexWait = 0, kFutexCmd = 0x7f;
  return nr == kNanosleep || nr == kClockNanosleep || nr == kPpoll || nr == kPselect6 ||
         (nr == kFutex && (regs[1] & kFutexCmd) == kFutexWait && regs[3] != 0);
}

// The bits of a word that can be an address: Linux lets user pointers carry a tag in their top
// byte (Top Byte Ignore: MTE, HWASan), which the hardware ignores and a comparison must too.
constexpr uint64_t kPointerBits = (uint64_t(1) << 56) - 1;

// The relocations that store a function's address in a slot memhook patches: JUMP_SLOT,
// GLOB_DAT, and an absolute 64-bit one with no addend (a function pointer in data).
constexpr SlotRelocation kSlotRelocations[] = {{R_AARCH64_JUMP_SLOT, "JUMP_SLOT", false},
                                               {R_AARCH64_GLOB_DAT, "GLOB_DAT", false},
                                               {R_AARCH64_ABS64, "R_AARCH64_ABS64", true}};

// DWARF register numbers (the AArch64 DWARF ABI): x29 (the frame pointer), sp, and the return
// address column, x30 (the link register).
constexpr int kDwarfFramePointer = 29, kDwarfStackPointer = 31, kDwarfReturnAddress = 30;

// Where an unwind row's return address is, in words below its CFA (common/unwind_rows.h). A
// prologue stores x30 beside x29 as the frame record (stp x29, x30: x30 one word above), so a row
// whose x29 is saved at slot k has x30 at slot k - 1; a function that keeps x29 (no frame record)
// saves x30 alone, and the row's slot field, unused for x29, holds x30's. ra_rule: whether CFI's
// "x30 at CFA - 8 * ra" fits a row with this x29 rule and slot (unwind/cfi_rows.cpp); x30 still
// in its register (a leaf, a PLT stub, a shrink-wrapped function before its prologue) is slot 0
// with x29 not saved (ra_in_register): where a signal interrupted such a function the walk takes
// x30 from the signal's ucontext (kUcLinkRegister), as gdb does; anywhere else it stops.
constexpr uint32_t ra_slot(uint32_t rule) {
  return rbp_rule(rule) == kRbpSaved ? rbp_slot(rule) - 1 : rbp_slot(rule);
}
inline bool ra_rule(int64_t ra, RbpRule* rbp, uint32_t* slot) {
  if (*rbp == kRbpSaved) return ra == int64_t(*slot) - 1 && ra >= 1;
  if (ra < 1 || ra > int64_t(kMaxRbpSlot)) return false;
  *slot = uint32_t(ra);
  return true;
}
inline bool ra_in_register(RbpRule* rbp, uint32_t* slot) {
  if (*rbp == kRbpSaved) return false;
  *slot = 0;
  return true;
}
constexpr uint64_t kUcLinkRegister = 184 + 8 * 30;  // x30 in uc_mcontext.regs
// The ucontext of a signal frame, from the stack pointer at the signal trampoline
// (__kernel_rt_sigreturn: struct rt_sigframe is a siginfo, then the ucontext).
constexpr uint64_t kSignalUcontext = 128;
// A return address as stored, its pointer authentication code (PAC, -mbranch-protection) gone:
// XPACLRI strips x30's by the process's own address size, and is a no-op (a hint) where the
// processor has no PAC.
inline uint64_t return_address(uint64_t stored) {
  register uint64_t lr asm("x30") = stored;
  asm("hint #7" : "+r"(lr));  // xpaclri
  return lr;
}

// A frame record at x29 (stp x29, x30, [sp, #-N]!; mov x29, sp): CFA = x29 + N, x29 saved at
// CFA - N, x30 above it. Its two words are one pair of the malloc entry's comparison, wherever
// GCC put the record in the frame.
constexpr bool frame_record_row(uint32_t r) {
  return rbp_rule(r) == kRbpSaved && cfa_offset(r) == 8 * uint64_t(rbp_slot(r));
}

// The malloc entry's pair comparison (malloc_entry.S), from its first step to its last: one,
// for every AArch64 processor.
extern "C" const char memhook_compare_pairs[], memhook_compare_pairs_last[];
inline void pair_steps(bool /*avx512*/, const char** first, const char** last) {
  *first = memhook_compare_pairs;
  *last = memhook_compare_pairs_last;
}

}  // namespace arch
}  // namespace memhook
