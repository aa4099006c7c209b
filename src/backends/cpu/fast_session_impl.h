// The fast CPU runner's insides, shared by fast_session.cc (planning a step's primitive, running)
// and fast_steps.cc (the steps of their own: attention, norms, concat, batch products): oneDNN
// handles owned RAII-style, and CpuRunner::Impl. Private to src/backends/cpu.
#pragma once

#include <sys/mman.h>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backends/cpu/dnnl_lib.h"
#include "backends/cpu/fast_fused.h"
#include "backends/cpu/fast_session.h"

#if KILN_HAVE_DNNL

namespace kiln {
namespace cpu_detail {

// Every oneDNN call goes through here: a failure names the call and the node it was for.
#define KILN_DNNL(node, call)                                                                              \
  do {                                                                                                     \
    dnnl_status_t st_ = (call);                                                                            \
    if (st_ != dnnl_success) {                                                                             \
      return KILN_ERROR(kUnsupported, "{}: oneDNN {} failed (status {})", (node), #call, int(st_));       \
    }                                                                                                      \
  } while (0)

using Dims = std::vector<int64_t>;

inline dnnl_format_tag_t plain_tag(size_t rank) {
  switch (rank) {
    case 1: return dnnl_a;
    case 2: return dnnl_ab;
    case 3: return dnnl_abc;
    case 4: return dnnl_abcd;
    case 5: return dnnl_abcde;
    default: return dnnl_abcdef;
  }
}

// Owns a memory descriptor.
struct Md {
  const DnnlLib* d = nullptr;
  dnnl_memory_desc_t md = nullptr;
  Md() = default;
  Md(const DnnlLib* lib, dnnl_memory_desc_t m) : d(lib), md(m) {}
  Md(Md&& o) noexcept : d(o.d), md(o.md) { o.md = nullptr; }
  Md& operator=(Md&& o) noexcept {
    std::swap(d, o.d);
    std::swap(md, o.md);
    return *this;
  }
  ~Md() {
    if (md) d->memory_desc_destroy(md);
  }
};

// A 64-byte aligned buffer. Buffers of 2 MiB or more (weights, activations) are mappings of their
// own, 2 MiB-aligned and advised as transparent huge pages: a batch-1 forward streams every weight
// once, and on 4 KiB pages each page of it is a TLB miss (ResNet-50: ~25,000 pages per run;
// bench/RESULTS.md "thirty-second session"). Their own mappings, not the heap, so the advice ends
// with them. Where the kernel's THP mode is "never" the advice is ignored. Allocation failure throws
// std::bad_alloc; CpuRunner turns it into a kOutOfMemory error.
struct BufferRelease {
  size_t mapped = 0;  // a mapping's length, 0 for the heap
  void operator()(char* q) const {
    if (mapped) {
      ::munmap(q, mapped);
    } else {
      std::free(q);
    }
  }
};
struct Buffer {
  using Release = BufferRelease;
  std::unique_ptr<char, Release> p;
  size_t size = 0;
  void resize(size_t n) {
    if (n <= size) return;
    constexpr size_t kHuge = size_t(2) << 20;
    if (n < kHuge) {
      void* q = nullptr;
      if (posix_memalign(&q, 64, (n + 63) / 64 * 64) != 0) throw std::bad_alloc();
      p = std::unique_ptr<char, Release>(static_cast<char*>(q), Release{});
    } else {
      // Over-map by 2 MiB, then unmap the ends around the aligned block.
      const size_t len = (n + kHuge - 1) / kHuge * kHuge;
      void* m = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) throw std::bad_alloc();
      char* base = static_cast<char*>(m);
      char* q = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + kHuge - 1) / kHuge * kHuge);
      if (q > base) ::munmap(base, size_t(q - base));
      if (base + len + kHuge > q + len) ::munmap(q + len, size_t(base + len + kHuge - (q + len)));
#ifdef MADV_HUGEPAGE
      ::madvise(q, len, MADV_HUGEPAGE);
#endif
      p = std::unique_ptr<char, Release>(q, Release{len});
    }
    size = n;
  }
};

// A primitive attribute and the post-op list it will take, both freed with it.
struct Attr {
  const DnnlLib* d;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t po = nullptr;
  explicit Attr(const DnnlLib* lib) : d(lib) {}
  Attr(const Attr&) = delete;
  Attr& operator=(const Attr&) = delete;
  ~Attr() {
    if (po) d->post_ops_destroy(po);
    if (attr) d->primitive_attr_destroy(attr);
  }
  Status create(const std::string& at) {
    KILN_DNNL(at, d->primitive_attr_create(&attr));
    KILN_DNNL(at, d->post_ops_create(&po));
    return Status::ok();
  }
};

// A primitive with the memories it executes on (handles bound per run).
struct Prim {
  dnnl_primitive_t p = nullptr;
  std::vector<std::pair<int, dnnl_memory_t>> args;  // (DNNL_ARG_*, memory)
  std::function<void()> host;  // set: kiln's own loop, run in the primitive's place
};

// Owns a primitive descriptor.
struct Pd {
  const DnnlLib* d;
  dnnl_primitive_desc_t p = nullptr;
  explicit Pd(const DnnlLib* lib) : d(lib) {}
  Pd(const Pd&) = delete;
  Pd& operator=(const Pd&) = delete;
  ~Pd() {
    if (p) d->primitive_desc_destroy(p);
  }
};

inline const char* impl_name(const DnnlLib* d, const_dnnl_primitive_desc_t pd) {
  const char* s = nullptr;
  if (d->primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s) != dnnl_success || !s) return "?";
  return s;
}

inline Dims static_dims(const Value* v) { return *v->type.shape->static_dims(); }
inline int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

// oneDNN's eltwise algorithm and parameters for an elementwise post-op (nullopt for kAdd).
struct EltwiseAlg {
  dnnl_alg_kind_t alg;
  float alpha, beta;
};
std::optional<EltwiseAlg> eltwise_alg(const CpuPostOp& op);
// Appends a post-op to `po` (`operand`: a kAdd's operand descriptor; null for the others).
Status append_post_op(const DnnlLib* d, dnnl_post_ops_t po, const CpuPostOp& op, const_dnnl_memory_desc_t operand,
                      const std::string& at);

}  // namespace cpu_detail

using cpu_detail::Attr;
using cpu_detail::Buffer;
using cpu_detail::Dims;
using cpu_detail::Md;
using cpu_detail::Pd;
using cpu_detail::Prim;

struct CpuRunner::Impl {
  const DnnlLib* d = nullptr;
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<const CpuPlan> cp;
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  std::vector<std::string> impls;
  std::vector<dnnl_memory_t> memories;
  std::vector<dnnl_primitive_t> primitives;
  std::vector<Buffer> weights;  // reordered weights, owned

  // Per step: an optional reorder of the source into `src_scratch`, the primitive, an optional
  // reorder of its result into the plain output.
  struct StepRun {
    Prim src_reorder, main, dst_reorder;
    std::vector<Prim> before;  // run before `main` (operands reordered into its layout)
    std::vector<Prim> after;   // run after `main` (attention's softmax and second matmul)
    std::deque<Buffer> operand_scratch;  // where `before` writes
    Buffer scratch;           // the step's own intermediate (attention's scores)
    dnnl_memory_t src_user = nullptr, src_mem = nullptr, dst_mem = nullptr, dst_user = nullptr;
    dnnl_memory_t src_reorder_out = nullptr, dst_reorder_in = nullptr;
    size_t out_bytes = 0;                     // a kLibrary output's size
    std::vector<int64_t> out_dims;
    // (memory, index into reads) bound to each read's buffer; weights/bias are bound once.
    std::vector<std::pair<dnnl_memory_t, size_t>> bind;
    // kFused, kRmsNorm: kiln's own loop, run instead of a primitive on the reads' row-major buffers.
    std::function<void(const std::vector<const float*>& reads, float* out)> loop;
  };
  std::vector<StepRun> runs;
  // Per step, where its result goes: at arena_offset[i] in the arena (plan_arena), or, for a
  // result no step releases (a graph output), the buffer it went to last run, written again when
  // nothing else holds it (a returned output keeps it; the step then takes a new one).
  static constexpr size_t kNoArena = ~size_t(0);
  std::vector<size_t> arena_offset;
  std::shared_ptr<Buffer> arena;
  std::vector<std::shared_ptr<Buffer>> out_cache;
  // Where each top-level value lives, for subgraph bodies of host steps (by pointer).
  std::unordered_map<const Value*, ValueRef> by_value;
  std::vector<const dnnl_memory_desc_t*> slot_md;  // per slot: the library layout it is written in
  std::deque<Md> mds;                               // owned descriptors slot_md points into
  Buffer src_scratch, dst_scratch;

  ~Impl() {
    if (!d) return;
    for (dnnl_primitive_t p : primitives) d->primitive_destroy(p);
    for (dnnl_memory_t m : memories) d->memory_destroy(m);
    if (stream) d->stream_destroy(stream);
    if (engine) d->engine_destroy(engine);
  }

  Expected<Md> make_md(const std::string& at, const Dims& dims, dnnl_format_tag_t tag) {
    dnnl_memory_desc_t md = nullptr;
    KILN_DNNL(at, d->memory_desc_create_with_tag(&md, int(dims.size()), dims.data(), dnnl_f32, tag));
    return Md(d, md);
  }
  Expected<dnnl_memory_t> memory(const std::string& at, const_dnnl_memory_desc_t md, void* handle = DNNL_MEMORY_NONE) {
    dnnl_memory_t m = nullptr;
    KILN_DNNL(at, d->memory_create(&m, md, engine, handle));
    memories.push_back(m);
    return m;
  }
  Expected<dnnl_primitive_t> primitive(const std::string& at, const_dnnl_primitive_desc_t pd) {
    dnnl_primitive_t p = nullptr;
    KILN_DNNL(at, d->primitive_create(&p, pd));
    primitives.push_back(p);
    return p;
  }
  // A reorder primitive from `from` to `to` (memories created here, handles bound later).
  Expected<Prim> reorder(const std::string& at, const_dnnl_memory_desc_t from, const_dnnl_memory_desc_t to,
                         dnnl_memory_t* in, dnnl_memory_t* out) {
    dnnl_primitive_desc_t pd = nullptr;
    KILN_DNNL(at, d->reorder_primitive_desc_create(&pd, from, engine, to, engine, nullptr));
    auto prim = primitive(at, pd);
    d->primitive_desc_destroy(pd);
    if (!prim) return prim.status();
    KILN_ASSIGN_OR_RETURN(*in, memory(at, from));
    KILN_ASSIGN_OR_RETURN(*out, memory(at, to));
    Prim r;
    r.p = *prim;
    r.args = {{DNNL_ARG_FROM, *in}, {DNNL_ARG_TO, *out}};
    return r;
  }
  // A constant weight reordered once from its plain layout into `want`.
  Expected<dnnl_memory_t> weight(const std::string& at, const Tensor& t, const_dnnl_memory_desc_t plain,
                                 const_dnnl_memory_desc_t want) {
    Buffer b;
    b.resize(d->memory_desc_get_size(want));
    dnnl_memory_t in = nullptr, out = nullptr;
    KILN_ASSIGN_OR_RETURN(Prim r, reorder(at, plain, want, &in, &out));
    KILN_DNNL(at, d->memory_set_data_handle(in, const_cast<void*>(t.raw())));
    KILN_DNNL(at, d->memory_set_data_handle(out, b.p.get()));
    std::vector<dnnl_exec_arg_t> args;
    for (auto& [k, m] : r.args) args.push_back({k, m});
    KILN_DNNL(at, d->primitive_execute(r.p, stream, int(args.size()), args.data()));
    KILN_DNNL(at, d->stream_wait(stream));
    weights.push_back(std::move(b));
    return out;
  }

  // Where step s's result, written by its primitive in layout `got`, goes: kept in that layout for
  // later steps when the plan says kLibrary, else reordered to `plain` after the step if different.
  Status place_result(const std::string& at, const CpuStep& s, StepRun& run, const_dnnl_memory_desc_t got,
                      const_dnnl_memory_desc_t plain) {
    if (s.out_layout == CpuLayout::kLibrary) {
      dnnl_memory_desc_t keep = nullptr;
      KILN_DNNL(at, d->memory_desc_clone(&keep, got));
      mds.emplace_back(d, keep);
      slot_md[s.out.index] = &mds.back().md;
      run.out_bytes = d->memory_desc_get_size(got);
    } else if (!d->memory_desc_equal(got, plain)) {
      KILN_ASSIGN_OR_RETURN(run.dst_reorder, reorder(at, got, plain, &run.dst_reorder_in, &run.dst_user));
      dst_scratch.resize(d->memory_desc_get_size(got));
    }
    return Status::ok();
  }

  // `attrs` made with `ops` (elementwise post-ops, no operands) in order.
  Status eltwise_attr(Attr& attrs, const std::vector<CpuPostOp>& ops, const std::string& at) {
    KILN_RETURN_IF_ERROR(attrs.create(at));
    for (const CpuPostOp& op : ops) KILN_RETURN_IF_ERROR(cpu_detail::append_post_op(d, attrs.po, op, nullptr, at));
    KILN_DNNL(at, d->primitive_attr_set_post_ops(attrs.attr, attrs.po));
    return Status::ok();
  }
  // Step i as the one primitive of `pd` reading its first read through `src` and writing `dst`
  // (the step's output): its implementation named, its memories made and the read bound.
  Status one_source_step(size_t i, const_dnnl_primitive_desc_t pd, const_dnnl_memory_desc_t src,
                         const_dnnl_memory_desc_t dst, const std::string& at) {
    StepRun& run = runs[i];
    impls[i] = fmt::format("oneDNN {}", cpu_detail::impl_name(d, pd));
    KILN_ASSIGN_OR_RETURN(run.main.p, primitive(at, pd));
    KILN_ASSIGN_OR_RETURN(dnnl_memory_t src_mem, memory(at, src));
    KILN_ASSIGN_OR_RETURN(run.dst_mem, memory(at, dst));
    run.main.args = {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_DST, run.dst_mem}};
    run.bind = {{src_mem, 0}};
    return Status::ok();
  }

  Status prepare();
  Status prepare_step(size_t i);
  size_t out_bytes(size_t i) const;  // the size of step i's result
  void plan_arena();
  // Replaces t, when it views arena memory, by a copy of its own.
  Status copy_out_of_arena(Tensor& t) const;
  Status prepare_attention(size_t i);
  Status prepare_norm(size_t i);
  Status prepare_transpose(size_t i);
  Status prepare_batch_matmul(size_t i);
  Status prepare_concat(size_t i);
  Status prepare_batch_norm(size_t i);
  Status prepare_stft(size_t i);
  Status prepare_eltwise(size_t i);
  Status prepare_rnn(size_t i);
  Status prepare_group_norm(size_t i);
  Status prepare_resample(size_t i);
  Status prepare_rms_norm(size_t i);
  Status prepare_softmax(size_t i);
  Status prepare_slice(size_t i);
  Expected<std::vector<Data>> run(std::vector<Data> inputs, std::vector<double>* step_ms);
};

}  // namespace kiln

#endif  // KILN_HAVE_DNNL
