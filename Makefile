# One build for everything: libcore.a, the programs, the tests, the man-page check.
#   make                 build libcore.a and every program into $(BUILD)
#   make test            Criterion unit tests, shell tests of the programs (the layering check
#                        among them), man-page check
#   make check           `make test`, then the whole suite again under ASan + UBSan
#   make SAN=1 test      the sanitizer build alone (in build-san/)
#   make STRICT=1        warnings are errors (development)
#   make V=1             full commands instead of one short line per step
#   make install PREFIX=/usr/local
#   make fuzz SECS=60    every libFuzzer harness of test/fuzz for SECS seconds (needs clang)
#   make test-cuda-emu   the cuda backend's kernels on the CPU (test/emu), against ref; part of
#                        test-unit, so of `make test`: needs a C++ compiler, not nvcc or a GPU
#                        (test-sh also runs the device All-to-All over NCCL emulated over MPI:
#                        test/sh/t-dist-dev.sh)
# Optional parts are probed and reported; override a probe with HAVE_X=0 or HAVE_X=1.

# `make` alone builds `all`, whatever rule comes first below (the CUDA block's is earlier).
.DEFAULT_GOAL := all
SAN ?= 0
ifeq ($(SAN),1)
BUILD ?= build-san
else
BUILD ?= build
endif
# what this build found (below, "what this build found")
FOUND := $(BUILD)/found
$(shell mkdir -p $(FOUND))
PREFIX ?= /usr/local
CC ?= cc
PKG_CONFIG ?= pkg-config
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
MPICC ?= mpicc
VERSION := 0.1.0

WARN := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wstrict-prototypes -Wvla
ifeq ($(STRICT),1)
WARN += -Werror
endif
OPT ?= -O3 -march=native
ifeq ($(SAN),1)
OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
endif
CFLAGS ?=
# -fno-math-errno: no libm call sets errno for us to read, and without it GCC will not
# vectorise sqrtf (the AdamW update). It changes no result.
CFLAGS += -std=c11 -D_GNU_SOURCE -DCORE_VERSION='"$(VERSION)"' $(OPT) -fno-math-errno $(WARN) -Ilib
LDFLAGS ?=
ifeq ($(SAN),1)
LDFLAGS += -fsanitize=address,undefined
# GCC 12's sanitizer runtime mistakes some dynamic TLS blocks (those of a library loaded with
# dlopen, as oneDNN and OpenBLAS are) for a pre-2.25 glibc header when a malloc'd block falls
# at that offset by chance, and LeakSanitizer's tracer then dies on exit ("Tracer caught
# signal 11"), failing a run whose tests passed. intercept_tls_get_addr=0 is the runtime's
# own switch for this (fixed upstream in GCC 14 and LLVM 17).
# allocator_release_to_os_interval_ms=-1: no release of free memory to the OS, which runs
# under an allocator region's lock; test/unit/cr-run.sh says why that lock matters.
export ASAN_OPTIONS := $(if $(ASAN_OPTIONS),$(ASAN_OPTIONS):)intercept_tls_get_addr=0:allocator_release_to_os_interval_ms=-1
endif
# Criterion workers at a time. Under the sanitizers, one: Criterion 2.4.1's runner leaks 48
# bytes (a calloc of its own) when test_backend's long moe_dispatch, whose timeout is raised
# above the suite's, runs beside other tests under --jobs=2, and LeakSanitizer fails the run
# after every test passed; with --jobs=1 it does not.
CR_JOBS := $(if $(filter 1,$(SAN)),1,2)
# Under the sanitizers each Criterion binary runs under test/unit/cr-run.sh: a run that hangs
# past 10 minutes (a worker deadlocked in GCC 12's ASan allocator after fork, not a test's
# verdict) is killed and run again, three tries in all; see that script.
CR_RUN := $(if $(filter 1,$(SAN)),sh test/unit/cr-run.sh)

# ---- probes -------------------------------------------------------------------------------
have_pc = $(shell $(PKG_CONFIG) --exists $(1) 2>/dev/null && echo 1 || echo 0)
HAVE_OPENMP ?= $(shell echo 'int main(void){return omp_get_max_threads()<1;}' | \
	$(CC) -fopenmp -include omp.h -x c - -o /dev/null >/dev/null 2>&1 && echo 1 || echo 0)
HAVE_OPENBLAS ?= $(call have_pc,openblas)
HAVE_YAML ?= $(call have_pc,yaml-0.1)
HAVE_ZLIB ?= $(call have_pc,zlib)
HAVE_JANSSON ?= $(call have_pc,jansson)
HAVE_LBFGS ?= $(call have_pc,liblbfgs)
HAVE_LIBDEFLATE ?= $(call have_pc,libdeflate)
HAVE_CRITERION ?= $(call have_pc,criterion)
HAVE_SENTENCEPIECE ?= $(call have_pc,sentencepiece)
HAVE_MPI ?= $(shell command -v $(MPICC) >/dev/null 2>&1 && echo 1 || echo 0)
# The CUDA backend (kernels/) is linked into libcore whenever nvcc is found, except in the
# sanitizer build (ASan and the CUDA runtime do not mix).
ifeq ($(SAN),1)
HAVE_CUDA ?= 0
else
HAVE_CUDA ?= $(if $(NVCC),1,0)
endif
# a C++ compiler: the CUDA emulator (test/emu)
HAVE_CXX ?= $(shell command -v $(CXX) >/dev/null 2>&1 && echo 1 || echo 0)
HAVE_PYTORCH ?= $(shell /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 && echo 1 || echo 0)

# The cpu backend's matrix products (lib/backend/cpu/cpu_blas.h): oneDNN's sgemm when
# libdnnl-dev is found, else OpenBLAS's, each loaded with dlopen at run time (never linked:
# OpenBLAS must be loaded by us to correct the kernel it picks). Only their headers are
# needed here; at run time Debian's OpenMP build of OpenBLAS (libopenblas0-openmp) is
# preferred, so that BLAS and our own loops share one thread pool.
OPENBLAS_OMP_DIR ?= $(wildcard /usr/lib/x86_64-linux-gnu/openblas-openmp)
BLAS_CFLAGS := $(shell $(PKG_CONFIG) --cflags openblas 2>/dev/null)
HAVE_DNNL ?= $(shell echo '\#include <oneapi/dnnl/dnnl.h>' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1 || echo 0)
CPU_BLAS_CFLAGS := $(if $(OPENBLAS_OMP_DIR),-DCORE_OPENBLAS_DIR='"$(OPENBLAS_OMP_DIR)"')
ifeq ($(HAVE_DNNL),1)
CPU_BLAS_CFLAGS += -DCORE_HAVE_DNNL=1
BLAS_FLAVOUR := oneDNN found: its sgemm by default, OpenBLAS's as the fallback
else
BLAS_FLAVOUR := OpenBLAS's sgemm (install libdnnl-dev for oneDNN's, about 10% faster)
endif
BLAS_FLAVOUR += (both loaded at run time$(if $(OPENBLAS_OMP_DIR),; OpenBLAS's OpenMP build from $(OPENBLAS_OMP_DIR)))
$(BUILD)/lib/backend/cpu/cpu_blas.o: CFLAGS += $(CPU_BLAS_CFLAGS)
# The cpu backend's loops (GELU, softmax, LayerNorm, exp) are bound by arithmetic more than by
# memory: with a*b+c fused into one fma (ISO C mode, -std=c11, turns contraction off) and, where
# the CPU has AVX-512, 16-wide vectors, GELU's forward and backward in a gpt-tiny step (1
# thread, Xeon with AVX-512) went from 10.4 and 14.5 ms to 6.9 and 7.6. The bits still do not
# depend on the thread count (the same code runs on every thread). AdamW, which must round as
# torch does, is built without (adamw_cpu.c).
CPU_LOOP_CFLAGS := -ffp-contract=fast
ifeq ($(firstword $(subst -, ,$(shell $(CC) -dumpmachine))),x86_64)
CPU_LOOP_CFLAGS += -mprefer-vector-width=512
endif
$(BUILD)/lib/backend/cpu/%.o: CFLAGS += $(CPU_LOOP_CFLAGS)
$(BUILD)/lib/backend/cpu/adamw_cpu.o: CFLAGS += -ffp-contract=off

REQUIRED := OPENBLAS YAML ZLIB JANSSON LBFGS OPENMP
MISSING := $(strip $(foreach r,$(REQUIRED),$(if $(filter 1,$(HAVE_$(r))),,$(r))))
ifneq ($(MISSING),)
$(error missing required libraries: $(MISSING); run scripts/setup-debian.sh or install libopenblas-dev libyaml-dev zlib1g-dev libjansson-dev liblbfgs-dev)
endif

CFLAGS += -fopenmp $(BLAS_CFLAGS) $(shell $(PKG_CONFIG) --cflags yaml-0.1 zlib jansson liblbfgs)
LIBS := $(shell $(PKG_CONFIG) --libs yaml-0.1 zlib jansson liblbfgs) -fopenmp -lm -ldl
# libdeflate: crc32 at about 3x zlib's speed (lib/common/crc.h); zlib's when absent.
ifeq ($(HAVE_LIBDEFLATE),1)
CFLAGS += -DHAVE_LIBDEFLATE=1 $(shell $(PKG_CONFIG) --cflags libdeflate)
LIBS += $(shell $(PKG_CONFIG) --libs libdeflate)
endif

# SentencePiece (tokenizer.h's spm:MODEL, dpc-shard tokenizer train): Debian's C++ library
# behind lib/io/spm_shim.cc, the library's one C++ file, built when the library and a C++
# compiler are found; without them tokenizer.c says what to install.
HAVE_SPM := $(if $(filter 11,$(HAVE_SENTENCEPIECE)$(HAVE_CXX)),1,0)
CXXFLAGS_SPM := -std=c++17 -D_GNU_SOURCE $(OPT) -Wall -Wextra -Wno-unused-parameter -Ilib \
	$(shell $(PKG_CONFIG) --cflags sentencepiece 2>/dev/null)
ifeq ($(HAVE_SPM),1)
SPM_OBJ := $(BUILD)/lib/io/spm_shim.o
LIBS += $(shell $(PKG_CONFIG) --libs sentencepiece) -lstdc++
$(BUILD)/lib/io/tokenizer.o: CFLAGS += -DCORE_HAVE_SPM=1
$(BUILD)/test/unit/test_tokenizer.o: CFLAGS += -DCORE_HAVE_SPM_TEST=1
$(SPM_OBJ): lib/io/spm_shim.cc
	@mkdir -p $(@D)
	$(call say,CXX,$<)
	$(Q)$(CXX) $(CXXFLAGS_SPM) -MMD -MP -c $< -o $@
endif

# ---- sources ------------------------------------------------------------------------------
# libcore is every .c file under lib/, one folder per layer (README, LAYOUT). Objects mirror
# the source tree under $(BUILD); -MMD -MP writes each object's header dependencies next to it.
# lib/backend/cuda (the cuda backend's C glue: cuBLAS and NCCL loaded at run time) is built
# with the CUDA backend only, below.
LIB_SRC := $(sort $(filter-out lib/backend/cuda/%,$(shell find lib -name '*.c')))
# lib/dist (dist.h) is dist_mpi.c over MPI when mpicc is found, else dist_single.c, a world of
# one rank. MPI's include flags are given to the files that include mpi.h alone (dist_mpi.c,
# test/mpi); libmpi is linked --as-needed, so that a program using no dist function, whose
# link pulls no dist_mpi.o out of libcore.a, does not load it (no DT_NEEDED).
ifeq ($(HAVE_MPI),1)
MPI_CFLAGS := $(shell $(MPICC) --showme:compile)
MPI_LIBS := $(shell $(MPICC) --showme:link)
LIB_SRC := $(filter-out lib/dist/dist_single.c,$(LIB_SRC))
LIBS += -Wl,--as-needed $(MPI_LIBS) -Wl,--no-as-needed
$(BUILD)/lib/dist/dist_mpi.o: CFLAGS += $(MPI_CFLAGS)
MPI_TEST_SRC := $(sort $(wildcard test/mpi/test_*.c))
else
LIB_SRC := $(filter-out lib/dist/dist_mpi.c,$(LIB_SRC))
MPI_TEST_SRC :=
endif
# test/mpi: plain programs (no Criterion) that t-*.sh run under mpirun, found through MPITEST
MPI_TESTS := $(MPI_TEST_SRC:test/mpi/%.c=$(BUILD)/test/mpi/%)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(SPM_OBJ)
CMD_SRC := $(sort $(wildcard cmd/*.c))
PROGS := $(CMD_SRC:cmd/%.c=$(BUILD)/bin/%)
TEST_SRC := $(sort $(wildcard test/unit/test_*.c))
TESTS := $(TEST_SRC:test/unit/%.c=$(BUILD)/test/%)
CU_SRC := $(sort $(shell find kernels -name '*.cu' 2>/dev/null))
CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/%.o)
ifeq ($(HAVE_CUDA),1)
# sm_90 machine code (Hopper: H100, H200) and compute_90 PTX, which newer GPUs compile at load
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3
NVCCFLAGS += -std=c++20 $(CUDA_ARCH) -DCORE_VERSION='"$(VERSION)"' -Ilib -Ikernels \
	-Xcompiler -Wall,-Wextra,-Wno-unused-parameter
# cuBLAS is not linked but loaded when the cuda device is opened (lib/backend/cuda/cublas_dl.c:
# linked, it costs every program ~215 MiB of memory at start), NCCL when a communicator is
# first made (lib/backend/cuda/nccl_dl.c), both through lib/common/dl_load.c; the CUDA runtime
# is linked statically.
CUDA_GLUE_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard lib/backend/cuda/*.c)))
LIB_OBJ += $(CU_OBJ) $(CUDA_GLUE_OBJ)
LIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lstdc++ -ldl -lrt \
	-lpthread
$(BUILD)/lib/backend/backend.o: CFLAGS += -DCORE_HAVE_CUDA=1
$(CUDA_GLUE_OBJ): $(BUILD)/lib/backend/cuda/%.o: lib/backend/cuda/%.c $(FOUND)/cflags
	@mkdir -p $(@D)
	$(call say,CC,$<)
	$(Q)$(CC) $(CFLAGS) -isystem $(CUDA_HOME)/include -MMD -MP -c $< -o $@
endif
MANS := $(sort $(wildcard man/*.1 man/*.5))
DEPS := $(LIB_OBJ:.o=.d) $(CMD_SRC:%.c=$(BUILD)/%.d) $(TEST_SRC:%.c=$(BUILD)/%.d) \
	$(MPI_TEST_SRC:%.c=$(BUILD)/%.d)

# ---- what this build found: $(BUILD)/found/ ------------------------------------------------
# One file per probe or flag set, rewritten only when its value changes, and every object the
# value reaches depends on that file (as git's objects depend on GIT-CFLAGS). So a build made
# without Open MPI and then with it compiles dist_mpi.o, relinks the MPI tests, and makes
# libcore.a anew from the current object list (no dist_single.o survives); new CFLAGS or a
# new compiler rebuild every object; SentencePiece found rebuilds tokenizer.o and its test; a
# new library list relinks the programs. `cat $(BUILD)/found/*` says what this build used.
# $(call record,NAME,VALUE): $(FOUND)/NAME holds VALUE; rewritten (and said) only when VALUE
# changes. (In the shell: a comparison in make alone, $(file <) against the value with
# findstring, took some equal values for different under make 4.3.)
record = $(shell f=$(FOUND)/$(1); printf '%s\n' '$(subst ','\'',$(strip $(2)))' >$$f.new && \
	if cmp -s $$f.new $$f; then rm -f $$f.new; else test -e $$f && \
	echo "==> $$f changed: what it reaches is rebuilt" >&2; mv -f $$f.new $$f; fi)
$(call record,cflags,$(CC) $(shell $(CC) -dumpfullversion 2>/dev/null) $(CFLAGS))
$(call record,libs,$(LDFLAGS) $(LIBS))
$(call record,libobjs,$(LIB_OBJ))
$(call record,mpi,HAVE_MPI=$(HAVE_MPI) $(MPI_CFLAGS))
$(call record,spm,HAVE_SPM=$(HAVE_SPM))
$(call record,cxx,$(CXX) $(CXXFLAGS_SPM))
$(call record,blas,$(CPU_BLAS_CFLAGS))
$(call record,cuda,HAVE_CUDA=$(HAVE_CUDA) $(NVCC) $(NVCCFLAGS))
$(call record,pytorch,HAVE_PYTORCH=$(HAVE_PYTORCH))
$(BUILD)/libcore.a: $(FOUND)/libobjs
$(BUILD)/lib/dist/dist_mpi.o $(MPI_TEST_SRC:%.c=$(BUILD)/%.o): $(FOUND)/mpi
$(BUILD)/lib/io/tokenizer.o $(BUILD)/test/unit/test_tokenizer.o: $(FOUND)/spm
$(SPM_OBJ): $(FOUND)/cxx
$(BUILD)/lib/backend/cpu/cpu_blas.o: $(FOUND)/blas
$(BUILD)/lib/backend/backend.o $(CU_OBJ) $(CUDA_GLUE_OBJ): $(FOUND)/cuda

# One short line per step; V=1 prints the full commands.
ifeq ($(V),1)
Q :=
say = @true
else
Q := @
say = @printf '  %-6s %s\n' $(1) $(2)
endif

.PHONY: all probe test test-unit test-sh test-man check install clean
all: probe $(BUILD)/libcore.a $(PROGS)

probe:
	@echo "==> OpenMP: $(if $(filter 1,$(HAVE_OPENMP)),found,not found)"
	@echo "==> matrix products: $(BLAS_FLAVOUR)"
	@echo "==> libyaml: found; zlib: found; jansson: found; liblbfgs: found"
	@echo "==> libdeflate: $(if $(filter 1,$(HAVE_LIBDEFLATE)),found (fast crc32),not found (crc32 from zlib, about 3x slower; install libdeflate-dev))"
	@echo "==> Criterion: $(if $(filter 1,$(HAVE_CRITERION)),found,not found (make test needs libcriterion-dev))"
	@echo "==> MPI: $(if $(filter 1,$(HAVE_MPI)),found ($(MPICC)): lib/dist over MPI,not found: lib/dist is single-process only (install libopenmpi-dev))"
	@echo "==> CUDA: $(if $(filter 1,$(HAVE_CUDA)),nvcc found ($(NVCC)): the cuda backend (kernels/) is built; cuBLAS and NCCL are loaded when first used,$(if $(NVCC),off in this build,nvcc not found): no cuda backend)"
	@echo "==> SentencePiece: $(if $(filter 1,$(HAVE_SPM)),found: spm:MODEL tokenizers and dpc-shard tokenizer train,not found (install libsentencepiece-dev$(if $(filter 1,$(HAVE_CXX)),, and g++)): the byte tokenizer only)"
	@echo "==> PyTorch (reference tests): $(if $(filter 1,$(HAVE_PYTORCH)),found,not found; reference tests will be skipped)"
	@echo "==> build: $(BUILD) $(if $(filter 1,$(SAN)),(ASan + UBSan))"
	@echo "==> what it found and the flags: $(FOUND)/ (a change there rebuilds what it reaches)"

$(BUILD)/%.o: %.c $(FOUND)/cflags
	@mkdir -p $(@D)
	$(call say,CC,$<)
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libcore.a: $(LIB_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $(LIB_OBJ)

$(BUILD)/bin/%: $(BUILD)/cmd/%.o $(BUILD)/libcore.a $(FOUND)/libs
	@mkdir -p $(@D)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $< $(BUILD)/libcore.a $(LIBS) -o $@

$(BUILD)/test/%: $(BUILD)/test/unit/%.o $(BUILD)/libcore.a $(FOUND)/libs
	@mkdir -p $(@D)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $< $(BUILD)/libcore.a $(LIBS) $(shell $(PKG_CONFIG) --libs criterion) -o $@

# the MPI tests: as the unit tests, without Criterion
$(BUILD)/test/mpi/%.o: CFLAGS += $(MPI_CFLAGS)
$(BUILD)/test/mpi/%: $(BUILD)/test/mpi/%.o $(BUILD)/libcore.a $(FOUND)/libs
	@mkdir -p $(@D)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $< $(BUILD)/libcore.a $(LIBS) -o $@

$(BUILD)/kernels/%.o: kernels/%.cu
	@mkdir -p $(@D)
	$(call say,NVCC,$<)
	$(Q)$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# Objects of programs and tests are kept (make would delete them as intermediates). Not
# `.SECONDARY:` with no list, which made every target secondary: a missing object (dist_mpi.o,
# when MPI is found after a build without it) was then never made, the archive being newer
# than its source.
.PRECIOUS: $(BUILD)/%.o

-include $(DEPS)

# ---- tests --------------------------------------------------------------------------------
# Each Criterion binary runs its tests in parallel processes; a failing test makes it exit 1.
# The shell tests get the programs' directory in BIN, the MPI test programs' in MPITEST (empty
# without MPI: those tests are skipped) and a scratch directory in TMPDIR.
test: all test-unit test-sh test-man

test-unit: $(TESTS)
ifneq ($(HAVE_CRITERION),1)
	$(error Criterion not found: install libcriterion-dev to run the unit tests)
endif
	@fail=0; for t in $(TESTS); do echo "--- $$t"; $(CR_RUN) $$t --jobs=$(CR_JOBS) || fail=1; done; \
	test $$fail = 0 || { echo "unit tests FAILED"; exit 1; }

test-sh: $(PROGS) $(MPI_TESTS)
	@BIN=$(abspath $(BUILD)/bin) MPITEST=$(if $(MPI_TESTS),$(abspath $(BUILD)/test/mpi)) EMUTEST=$(if $(EMU_MPI_TESTS),$(abspath $(EMU_DIR))) SAN=$(SAN) HAVE_PYTORCH=$(HAVE_PYTORCH) sh test/sh/run.sh

# A man page passes when groff renders it without a single warning.
# Rendered as man(1) renders it for an 80-column terminal (tbl, UTF-8, line length 78n), where
# "cannot adjust line" and "table wider than line width" show, and for print.
test-man:
	@fail=0; for m in $(MANS); do \
	  out=$$(groff -t -man -Tutf8 -rLL=78n -ww -z $$m 2>&1; groff -t -man -ww -z $$m 2>&1); \
	  if [ -n "$$out" ]; then echo "man page $$m: $$out"; fail=1; else echo "man page $$m: ok"; fi; \
	done; test $$fail = 0

check: test
	$(MAKE) SAN=1 test-unit test-sh

# ---- fuzzing ------------------------------------------------------------------------------
# test/fuzz/fuzz_NAME.c: one libFuzzer harness per parser (test/fuzz/harness.h says what each
# checks), seeded by the committed corpus test/fuzz/corpus/NAME, with every input that ever
# failed kept in test/fuzz/regress/NAME. Two builds of the same harnesses:
#   make test-fuzz-replay   each harness linked by $(CC) with test/fuzz/replay.c (a main that
#                           runs every file of those two folders, in name order) and
#                           libcore.a; part of test-unit, so of `make test` and, under ASan and
#                           UBSan, of `make check`. No clang needed.
#   make fuzz [SECS=60]     each harness built by clang with libFuzzer, ASan and UBSan (libcore
#                           too, in $(BUILD)/fuzz/libfuzzer), run SECS seconds; prints its
#                           executions, coverage and crashes; crashing inputs are written to
#                           test/fuzz/crashes/NAME (move each bug's into regress/NAME).
FUZZ_SRC := $(sort $(wildcard test/fuzz/fuzz_*.c))
FUZZ_NAMES := $(FUZZ_SRC:test/fuzz/fuzz_%.c=%)
FUZZ_REPLAY := $(FUZZ_NAMES:%=$(BUILD)/fuzz/replay/%)
FUZZ_OBJ := $(FUZZ_SRC:%.c=$(BUILD)/%.o) $(BUILD)/test/fuzz/harness.o $(BUILD)/test/fuzz/replay.o
FUZZ_CC ?= clang
SECS ?= 60
FUZZ_DIR := $(BUILD)/fuzz/libfuzzer
FUZZ_CFLAGS := $(filter-out -O% -march=% -g -fsanitize=% -fno-sanitize-recover=% \
	-fno-omit-frame-pointer -Werror,$(CFLAGS)) -g -O1 -fno-omit-frame-pointer \
	-fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_DIR)/%.o)
FUZZ_BINS := $(FUZZ_NAMES:%=$(FUZZ_DIR)/bin/%)
# Evaluated only by `make fuzz`: the replay needs no clang.
HAVE_LIBFUZZER ?= $(shell echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) \
	{ return d && n; }' | $(FUZZ_CC) -fsanitize=fuzzer -x c - -o /dev/null >/dev/null 2>&1 \
	&& echo 1 || echo 0)

.PHONY: fuzz fuzz-probe test-fuzz-replay
$(call record,fuzz,$(FUZZ_CC) $(FUZZ_CFLAGS))
$(FUZZ_LIB_OBJ) $(FUZZ_DIR)/test/fuzz/harness.o $(FUZZ_SRC:%.c=$(FUZZ_DIR)/%.o): $(FOUND)/fuzz
$(FUZZ_DIR)/libcore.a: $(FOUND)/libobjs
test-unit: test-fuzz-replay

$(BUILD)/fuzz/replay/%: $(BUILD)/test/fuzz/fuzz_%.o $(BUILD)/test/fuzz/harness.o \
		$(BUILD)/test/fuzz/replay.o $(BUILD)/libcore.a
	@mkdir -p $(@D)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $(filter %.o,$^) $(BUILD)/libcore.a $(LIBS) -o $@

# Each harness on its corpus and regressions; one line each, the failing input named.
test-fuzz-replay: $(FUZZ_REPLAY)
	@fail=0; for n in $(FUZZ_NAMES); do \
	  dirs=test/fuzz/corpus/$$n; [ -d test/fuzz/regress/$$n ] && dirs="$$dirs test/fuzz/regress/$$n"; \
	  printf 'fuzz replay %-16s ' $$n; $(BUILD)/fuzz/replay/$$n $$dirs || { fail=1; echo "fuzz replay $$n FAILED"; }; \
	done; test $$fail = 0 || { echo "fuzz replay FAILED"; exit 1; }

fuzz-probe:
	@if [ "$(HAVE_LIBFUZZER)" = 1 ]; then echo "==> libFuzzer: found ($(FUZZ_CC))"; else \
	  echo "==> libFuzzer: not found: make fuzz needs clang with libFuzzer (apt-get install clang; FUZZ_CC=clang-N for another)"; exit 1; fi

$(FUZZ_DIR)/%.o: %.c | fuzz-probe
	@mkdir -p $(@D)
	$(call say,FUZZCC,$<)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_DIR)/lib/dist/dist_mpi.o: FUZZ_CFLAGS += $(MPI_CFLAGS)

# SentencePiece's shim, instrumented too (fuzz_spm reaches the library through it)
ifeq ($(HAVE_SPM),1)
FUZZ_CXX ?= clang++
FUZZ_LIB_OBJ += $(FUZZ_DIR)/lib/io/spm_shim.o
$(FUZZ_DIR)/lib/io/tokenizer.o: FUZZ_CFLAGS += -DCORE_HAVE_SPM=1
$(FUZZ_DIR)/lib/io/spm_shim.o: lib/io/spm_shim.cc | fuzz-probe
	@mkdir -p $(@D)
	$(call say,FUZZCXX,$<)
	$(Q)$(FUZZ_CXX) $(filter-out -O% -march=%,$(CXXFLAGS_SPM)) -g -O1 -fno-omit-frame-pointer \
		-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize=vptr,function -MMD -MP \
		-c $< -o $@
endif

$(FUZZ_DIR)/libcore.a: $(FUZZ_LIB_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $(FUZZ_LIB_OBJ)

$(FUZZ_DIR)/bin/%: $(FUZZ_DIR)/test/fuzz/fuzz_%.o $(FUZZ_DIR)/test/fuzz/harness.o \
		$(FUZZ_DIR)/libcore.a
	@mkdir -p $(@D)
	$(call say,LINK,$@)
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer,address,undefined $(filter %.o,$^) $(FUZZ_DIR)/libcore.a \
		$(LIBS) -o $@

fuzz: fuzz-probe $(FUZZ_BINS)
	@sh test/fuzz/run.sh $(FUZZ_DIR)/bin $(BUILD)/fuzz/work $(SECS) $(FUZZ_NAMES)

-include $(FUZZ_OBJ:.o=.d) $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_DIR)/test/fuzz/harness.d \
	$(FUZZ_SRC:%.c=$(FUZZ_DIR)/%.d)

# ---- the cuda backend on the CPU ----------------------------------------------------------
# make test-cuda-emu   kernels/*.cu compiled as C++ by $(CXX) against test/emu/include, whose
#                      headers and test/emu/emu.cpp stand in for the CUDA runtime, cuBLAS and
#                      CUB and run every thread of every kernel on the CPU; linked with the
#                      registry built with the cuda backend (backend.o again, -DCORE_HAVE_CUDA)
#                      and the other libcore objects of $(BUILD), into test_backend, which then
#                      compares the cuda backend's real kernel code with ref, op by op (and
#                      the attention and GPT-2 step cases again with the fused attention),
#                      then again with the stream's work deferred until waited for
#                      (CUDA_EMU_STREAMS=late-first: launch arguments must be values, the
#                      host must wait before it reads), and the second queue in both orders.
#                      First test/emu/selftest checks the emulator itself. Needs neither nvcc
#                      nor a GPU nor cuBLAS; part of `make test`'s unit tests (about 40 s on
#                      2 cores once libcore is built). SAN=1: kernels and emulator under ASan and
#                      UBSan too.
#                      Environment: CUDA_EMU_* (test/emu/emu.cpp).
# -ffp-contract=off: no a*b+c is fused into an fma that the CUDA source does not write;
# -Wno-unknown-pragmas, -Wno-pass-failed: g++ and clang++ on the kernels' #pragma unroll.
EMU_DIR := $(BUILD)/emu
EMU_CXXFLAGS := -std=c++20 -O1 -ffp-contract=off -Itest/emu/include -Ilib -Ikernels \
	-DCORE_CUDA_EMU -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -Wno-pass-failed \
	$(filter -g -fno-omit-frame-pointer -fsanitize=% -fno-sanitize-recover=% -Werror,$(OPT) \
	$(WARN))
EMU_OBJ := $(CU_SRC:%.cu=$(EMU_DIR)/%.o) $(EMU_DIR)/test/emu/emu.o \
	$(EMU_DIR)/test/emu/nccl_emu.o $(EMU_DIR)/lib/backend/backend.o
EMU_LIB_OBJ := $(filter-out $(BUILD)/lib/backend/backend.o,$(LIB_SRC:%.c=$(BUILD)/%.o)) $(SPM_OBJ)
# the usual libraries, less the CUDA runtime's (the emulator replaces it)
emu_comma := ,
EMU_LIBS := $(filter-out -lcudart_static -L$(CUDA_HOME)/lib64 \
	-Wl$(emu_comma)-rpath$(emu_comma)$(CUDA_HOME)/lib64,$(LIBS))

.PHONY: test-cuda-emu
test-unit: test-cuda-emu
$(call record,emu,$(CXX) $(EMU_CXXFLAGS))
$(EMU_OBJ) $(EMU_DIR)/test/emu/selftest.o: $(FOUND)/emu
$(EMU_DIR)/test/emu/nccl_emu.o $(EMU_DIR)/test/mpi/test_dist_dev.o \
	$(EMU_DIR)/test/mpi/test_moe_dist.o: $(FOUND)/mpi

$(EMU_DIR)/kernels/%.o: kernels/%.cu
	@mkdir -p $(@D)
	$(call say,EMUCXX,$<)
	$(Q)$(CXX) -x c++ $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(EMU_DIR)/test/emu/%.o: test/emu/%.cpp
	@mkdir -p $(@D)
	$(call say,EMUCXX,$<)
	$(Q)$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(EMU_DIR)/lib/backend/backend.o: lib/backend/backend.c $(FOUND)/cflags
	@mkdir -p $(@D)
	$(call say,CC,$<)
	$(Q)$(CC) $(CFLAGS) -DCORE_HAVE_CUDA=1 -MMD -MP -c $< -o $@

$(EMU_DIR)/test_backend: $(BUILD)/test/unit/test_backend.o $(EMU_OBJ) $(EMU_LIB_OBJ) $(FOUND)/libs
	$(call say,LINK,$@)
	$(Q)$(CXX) $(LDFLAGS) $(filter %.o,$^) $(EMU_LIBS) $(shell $(PKG_CONFIG) --libs criterion) -o $@

# NCCL emulated over MPI (test/emu/nccl_emu.cpp: one emulated GPU per MPI process); without
# MPI its calls fail with "built without MPI". build/emu/test_dist_dev: test/mpi/test_dist_dev.c
# against the emulator, run under mpirun by test/sh/t-dist-dev.sh (EMUTEST): the device
# All-to-All (lib/dist/dist_dev.c) through the cuda backend's NCCL code (kernels/nccl.cu); and
# build/emu/moe-bench, whose --device cuda --only=alltoall the same test runs.
ifeq ($(HAVE_MPI),1)
$(EMU_DIR)/test/emu/nccl_emu.o: EMU_CXXFLAGS += $(MPI_CFLAGS) -DEMU_NCCL_MPI=1
ifeq ($(HAVE_CXX),1)
EMU_MPI_TESTS := $(EMU_DIR)/test_dist_dev $(EMU_DIR)/test_moe_dist $(EMU_DIR)/moe-bench \
	$(EMU_DIR)/moe-profile
endif
endif
# (again here: test-sh's rule above is read before EMU_MPI_TESTS is set, and a rule's
# prerequisites are expanded when it is read)
test-sh: $(EMU_MPI_TESTS)

$(EMU_DIR)/test/mpi/%.o: test/mpi/%.c $(FOUND)/cflags
	@mkdir -p $(@D)
	$(call say,CC,$<)
	$(Q)$(CC) $(CFLAGS) $(MPI_CFLAGS) -DCORE_CUDA_EMU -MMD -MP -c $< -o $@

$(EMU_DIR)/test_dist_dev: $(EMU_DIR)/test/mpi/test_dist_dev.o $(EMU_OBJ) $(EMU_LIB_OBJ) $(FOUND)/libs
	$(call say,LINK,$@)
	$(Q)$(CXX) $(LDFLAGS) $(filter %.o,$^) $(EMU_LIBS) -o $@

# the distributed MoE layer on the emulated device (test/mpi/test_moe_dist.c --device cuda),
# run under mpirun by test/sh/t-moe-dist-dev.sh
$(EMU_DIR)/test_moe_dist: $(EMU_DIR)/test/mpi/test_moe_dist.o $(EMU_OBJ) $(EMU_LIB_OBJ) $(FOUND)/libs
	$(call say,LINK,$@)
	$(Q)$(CXX) $(LDFLAGS) $(filter %.o,$^) $(EMU_LIBS) -o $@

# moe-bench on the emulated cuda backend: --device cuda --only=alltoall under mpirun
$(EMU_DIR)/moe-bench: $(BUILD)/cmd/moe-bench.o $(EMU_OBJ) $(EMU_LIB_OBJ) $(FOUND)/libs
	$(call say,LINK,$@)
	$(Q)$(CXX) $(LDFLAGS) $(filter %.o,$^) $(EMU_LIBS) -o $@

# moe-profile on the emulated cuda backend: a dictionary of the layer on device memory
$(EMU_DIR)/moe-profile: $(BUILD)/cmd/moe-profile.o $(EMU_OBJ) $(EMU_LIB_OBJ) $(FOUND)/libs
	$(call say,LINK,$@)
	$(Q)$(CXX) $(LDFLAGS) $(filter %.o,$^) $(EMU_LIBS) -o $@

# the emulator against CUDA's, cuBLAS's and CUB's semantics, first
$(EMU_DIR)/selftest: $(EMU_DIR)/test/emu/selftest.o $(EMU_DIR)/test/emu/emu.o
	$(call say,LINK,$@)
	$(Q)$(CXX) $(LDFLAGS) $(filter %.o,$^) -o $@

test-cuda-emu: $(EMU_DIR)/selftest $(EMU_DIR)/test_backend
ifneq ($(HAVE_CRITERION),1)
	$(error Criterion not found: install libcriterion-dev to run the unit tests)
endif
	@$(EMU_DIR)/selftest
	@echo "--- $(EMU_DIR)/test_backend (the cuda backend's kernels on the CPU, test/emu)"
	@$(CR_RUN) $(EMU_DIR)/test_backend --jobs=$(CR_JOBS)
	@echo "--- $(EMU_DIR)/test_backend, attention, the GPT-2 step and tf32/bf16 (which keep the cuBLAS attention), with CORE_CUDA_ATTENTION=fused (kernels/attention.cu)"
	@CORE_CUDA_ATTENTION=fused $(CR_RUN) $(EMU_DIR)/test_backend --jobs=$(CR_JOBS) \
		--filter 'backend/@(attention|gpt2_training_step|reduced_precision_products)'
	@echo "--- $(EMU_DIR)/test_backend with CUDA_EMU_STREAMS=late-first (work on the backend's stream runs only when waited for), and the second queue with late-others"
	@CUDA_EMU_STREAMS=late-first $(CR_RUN) $(EMU_DIR)/test_backend --jobs=$(CR_JOBS)
	@CUDA_EMU_STREAMS=late-others $(CR_RUN) $(EMU_DIR)/test_backend --filter 'backend/side_queue'

-include $(EMU_OBJ:.o=.d) $(EMU_DIR)/test/emu/selftest.d $(EMU_DIR)/test/mpi/test_dist_dev.d \
	$(EMU_DIR)/test/mpi/test_moe_dist.d

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 755 $(PROGS) $(DESTDIR)$(PREFIX)/bin
	for m in $(MANS); do s=$${m##*.}; install -m 644 $$m $(DESTDIR)$(PREFIX)/share/man/man$$s; done

clean:
	rm -rf build build-san
