// Writing and reading engine files (the layout is in engine_file.h).
#include "runtime/engine_file.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "ir/text.h"
#include "runtime/bytes.h"
#include "ops/op_registry.h"
#include "ir/verifier.h"

namespace kiln {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', 'N'};
constexpr size_t kHeaderBytes = 24;
constexpr size_t kSectionHeaderBytes = 16;
constexpr size_t kAlign = 64;
// Constants up to this many elements stay inline in the graph text.
constexpr int64_t kInlineElements = 16;

void put_ref(ByteWriter& w, const ValueRef& r) {
  w.u8(uint8_t(r.kind));
  w.u32(r.index);
}

ValueRef get_ref(ByteReader& r) {
  ValueRef v;
  uint8_t k = r.get<uint8_t>("a value reference");
  v.index = r.get<uint32_t>("a value reference");
  v.kind = k <= uint8_t(ValueRef::Kind::kConstant) ? ValueRef::Kind(k) : ValueRef::Kind::kNone;
  if (k > uint8_t(ValueRef::Kind::kConstant)) v.index = UINT32_MAX;  // verify_plan rejects it
  return v;
}

void put_refs(ByteWriter& w, const std::vector<ValueRef>& refs) {
  w.u32(uint32_t(refs.size()));
  for (const ValueRef& r : refs) put_ref(w, r);
}

std::vector<ValueRef> get_refs(ByteReader& r) {
  std::vector<ValueRef> out(r.count("a reference list", 5));
  for (auto& v : out) v = get_ref(r);
  return out;
}

// Section data starts at a multiple of kAlign from the file's start (weights are read in place).
size_t section_start(size_t at) { return (at + kSectionHeaderBytes + kAlign - 1) / kAlign * kAlign - kSectionHeaderBytes; }

void section(ByteWriter& w, const char tag[4], const std::string& data) {
  w.bytes().resize(section_start(w.bytes().size()), '\0');
  w.raw(tag, 4);
  w.u32(0);
  w.u64(data.size());
  w.raw(data.data(), data.size());
}

// Every constant of g and its nested graphs, in a fixed order (the graph text's).
void all_constants(const Graph& g, std::vector<const Value*>& out) {
  for (const auto& v : g.values) {
    if (v->constant) out.push_back(v.get());
  }
  for (const auto& n : g.nodes) {
    for (const auto& [key, a] : n->attrs) {
      if (a.g) all_constants(*a.g, out);
      for (const auto& sg : a.graphs) all_constants(*sg, out);
    }
  }
}

void values_by_name(Graph& g, std::unordered_map<std::string, Value*>& out) {
  for (auto& v : g.values) out[v->name] = v.get();
  for (auto& n : g.nodes) {
    for (auto& [key, a] : n->attrs) {
      if (a.g) values_by_name(*a.g, out);
      for (auto& sg : a.graphs) values_by_name(*sg, out);
    }
  }
}

bool elide(const Value& v) { return v.constant->dtype() != DType::kString && v.constant->numel() > kInlineElements; }

struct Sections {
  std::map<std::string, std::pair<const char*, size_t>> by_tag;
  std::vector<std::string> order;
};

// Magic, version, size and checksum; then the section table. Each error is the file's name plus
// what is wrong with it.
Expected<Sections> open_sections(std::string_view b, const std::string& name) {
  auto err = [&](const std::string& what) { return KILN_ERROR(kInvalidModel, "{}: {}", name, what); };
  if (b.size() < sizeof(kMagic) || std::memcmp(b.data(), kMagic, sizeof(kMagic)) != 0) {
    if (b.substr(0, 4096).find("kiln-artifact-0") != std::string_view::npos) {
      return err("an engine recipe from an older kiln (format kiln-artifact-0); rebuild it with `kiln build`");
    }
    return err("not a kiln engine file (no KILNENGN magic); build one with `kiln build MODEL.onnx -o FILE.kiln`");
  }
  if (b.size() < kHeaderBytes + 8) return err(fmt::format("truncated engine file ({} bytes)", b.size()));
  uint32_t version;
  uint64_t size;
  std::memcpy(&version, b.data() + 8, 4);
  std::memcpy(&size, b.data() + 16, 8);
  if (version != kEngineFormatVersion) {
    return err(fmt::format("engine format version {}, this kiln reads version {}; rebuild the engine with this kiln",
                           version, kEngineFormatVersion));
  }
  if (size != b.size()) {
    return err(fmt::format("{} engine file: {} bytes, its header says {}", b.size() < size ? "truncated" : "oversized",
                           b.size(), size));
  }
  uint64_t stored;
  std::memcpy(&stored, b.data() + b.size() - 8, 8);
  if (engine_checksum(b.data(), b.size() - 8) != stored) return err("checksum mismatch: the engine file is corrupted");
  Sections s;
  size_t at = kHeaderBytes, end = b.size() - 8;
  while (at < end) {
    at = section_start(at);
    if (at > end || end - at < kSectionHeaderBytes) return err("corrupted section table");
    std::string tag(b.data() + at, 4);
    uint64_t len;
    std::memcpy(&len, b.data() + at + 8, 8);
    at += kSectionHeaderBytes;
    if (len > end - at) return err(fmt::format("section {} runs past the end of the file", tag));
    if (s.by_tag.count(tag)) return err(fmt::format("section {} appears twice", tag));
    s.by_tag[tag] = {b.data() + at, size_t(len)};
    s.order.push_back(tag);
    at += size_t(len);
  }
  for (const char* need : {"META", "GRPH", "WTAB", "WGHT", "PLAN"}) {
    if (!s.by_tag.count(need)) return err(fmt::format("no {} section", need));
  }
  return s;
}

Expected<nlohmann::json> parse_meta(const Sections& s, const std::string& name) {
  auto [p, n] = s.by_tag.at("META");
  nlohmann::json j = nlohmann::json::parse(p, p + n, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return KILN_ERROR(kInvalidModel, "{}: META section is not a JSON object", name);
  return j;
}

}  // namespace

namespace {

// One chunk: four interleaved multiply-rotate lanes over 8-byte words, folded with the chunk's
// length and its tail bytes. Every step is a bijection of the lane state given the word.
uint64_t chunk_hash(const unsigned char* p, size_t size) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t lane[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
  auto step = [](uint64_t& h, uint64_t w) {
    h ^= w;
    h *= kMul;
    h = (h << 31) | (h >> 33);
  };
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * size_t(k), 8);
      step(lane[k], w);
    }
  }
  uint64_t h = uint64_t(size);
  for (uint64_t l : lane) step(h, l);
  for (; i < size; ++i) step(h, p[i]);
  return h;
}

}  // namespace

uint64_t engine_checksum(const void* data, size_t size) {
  // Chunks hashed on the thread pool, their hashes folded in order: a large engine is verified at
  // memory speed. A changed word changes its chunk's hash, and the fold is a bijection in each.
  constexpr size_t kChunk = size_t(4) << 20;
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t chunks = (size + kChunk - 1) / kChunk;
  std::vector<uint64_t> hashes(chunks);
  parallel_for(int64_t(chunks), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      size_t at = size_t(c) * kChunk;
      hashes[size_t(c)] = chunk_hash(p + at, std::min(kChunk, size - at));
    }
  });
  uint64_t h = chunk_hash(reinterpret_cast<const unsigned char*>(&size), sizeof(size));
  for (uint64_t x : hashes) {
    h ^= x;
    h *= 0x9E3779B97F4A7C15ull;
    h = (h << 31) | (h >> 33);
  }
  return h;
}

namespace {

// Copies g's values, nodes and subgraphs into `out` (its parent links already set). `map` takes each
// value to its copy, for g and every graph around it, so a subgraph's reads of outer values find
// theirs. What the text form would not carry is not copied either: node indices are positions
// (as the parser numbers them), provenance and symbolic element values are left for the passes and
// inference to make again.
Status copy_graph_into(const Graph& g, Graph& out, std::unordered_map<const Value*, Value*>& map) {
  auto find = [&](const Value* v, const std::string& what) -> Expected<Value*> {
    if (!v) return nullptr;
    auto it = map.find(v);
    if (it == map.end()) return KILN_ERROR(kInternal, "cloning graph '{}': {} '{}' is not in scope", g.name, what, v->name);
    return it->second;
  };
  out.name = g.name;
  for (const auto& v : g.values) {
    Value* c = out.add_value(v->name, v->type);
    // Large constants share their storage (the passes replace a constant, never write into one);
    // small ones are copies.
    if (v->constant) c->constant = elide(*v) ? *v->constant : v->constant->clone();
    map[v.get()] = c;
  }
  for (const Value* v : g.inputs) {
    KILN_ASSIGN_OR_RETURN(Value * c, find(v, "input"));
    out.inputs.push_back(c);
  }
  for (const auto& n : g.nodes) {
    auto c = std::make_unique<Node>();
    c->op = n->op;
    c->name = n->name;
    c->index = int(out.nodes.size());
    c->owner = &out;
    for (const Value* v : n->inputs) {
      KILN_ASSIGN_OR_RETURN(Value * x, find(v, "an input of " + n->describe()));
      c->inputs.push_back(x);
    }
    for (size_t k = 0; k < n->outputs.size(); ++k) {
      KILN_ASSIGN_OR_RETURN(Value * y, find(n->outputs[k], "an output of " + n->describe()));
      if (y) {
        y->producer = c.get();
        y->producer_output = int(k);
      }
      c->outputs.push_back(y);
    }
    for (const auto& [key, a] : n->attrs) {
      Attribute b = a;
      if (a.kind == Attribute::Kind::kTensor) b.t = a.t.clone();
      for (Tensor& t : b.tensors) t = t.clone();
      auto sub = [&](const std::shared_ptr<Graph>& from) -> Expected<std::shared_ptr<Graph>> {
        auto to = std::make_shared<Graph>();
        to->parent = &out;
        to->parent_node = c.get();
        KILN_RETURN_IF_ERROR(copy_graph_into(*from, *to, map));
        return to;
      };
      if (a.g) {
        KILN_ASSIGN_OR_RETURN(b.g, sub(a.g));
      }
      for (size_t k = 0; k < a.graphs.size(); ++k) {
        KILN_ASSIGN_OR_RETURN(b.graphs[k], sub(a.graphs[k]));
      }
      c->attrs.emplace(key, std::move(b));
    }
    out.nodes.push_back(std::move(c));
  }
  for (const Value* v : g.outputs) {
    KILN_ASSIGN_OR_RETURN(Value * c, find(v, "output"));
    out.outputs.push_back(c);
  }
  return Status::ok();
}

}  // namespace

Expected<std::unique_ptr<Graph>> clone_graph(const Graph& g) {
  auto out = std::make_unique<Graph>();
  std::unordered_map<const Value*, Value*> map;
  map.reserve(g.values.size());
  KILN_RETURN_IF_ERROR(copy_graph_into(g, *out, map));
  return out;
}

bool looks_like_engine_file(const std::string& first_bytes) {
  return first_bytes.size() >= sizeof(kMagic) && std::memcmp(first_bytes.data(), kMagic, sizeof(kMagic)) == 0;
}

Expected<std::string> write_engine_file(const nlohmann::json& meta, const Plan& plan,
                                        const std::map<std::string, std::string>& extra) {
  const Graph& g = *plan.graph;
  std::vector<const Value*> consts;
  all_constants(g, consts);
  // WTAB finds a weight by its name: a constant whose name another (in another subgraph) shares is
  // printed whole in GRPH instead, as clone_graph does.
  std::unordered_map<std::string, int> uses;
  for (const Value* v : consts) ++uses[v->name];
  auto elided_here = [&](const Value& v) { return elide(v) && uses[v.name] == 1; };
  std::unordered_set<const Value*> elided;
  ByteWriter wtab, wght;
  // Without graph weights (a GPU engine, whose device plan holds its own), elided constants are
  // declared in GRPH and have no data anywhere.
  const bool graph_weights = meta.is_object() ? meta.value("graph_weights", true) : true;
  uint32_t n_elided = 0;
  for (const Value* v : consts) n_elided += elided_here(*v) && graph_weights;
  wtab.u32(n_elided);
  for (const Value* v : consts) {
    if (!elided_here(*v)) continue;
    if (!graph_weights) {
      elided.insert(v);
      continue;
    }
    const Tensor& t = *v->constant;
    if (!t.raw()) return KILN_ERROR(kInternal, "constant '{}' has no data to save", v->name);
    elided.insert(v);
    wght.pad(kAlign);
    wtab.str(v->name);
    wtab.u8(uint8_t(t.dtype()));
    wtab.u32(uint32_t(t.rank()));
    for (int64_t d : t.dims()) wtab.i64(d);
    wtab.u64(wght.bytes().size());
    wtab.u64(t.nbytes());
    wght.raw(t.raw(), t.nbytes());
  }
  PrintOptions po;
  po.elided_constants = &elided;
  std::string text = print_graph(g, po);

  ByteWriter wplan;
  wplan.u32(plan.slots);
  put_refs(wplan, plan.inputs);
  put_refs(wplan, plan.outputs);
  wplan.u32(uint32_t(plan.constants.size()));
  for (const Value* c : plan.constants) wplan.str(c->name);
  wplan.u32(uint32_t(plan.steps.size()));
  for (const PlanStep& s : plan.steps) {
    wplan.u8(uint8_t(s.kind));
    wplan.u32(s.node);
    put_refs(wplan, s.inputs);
    put_refs(wplan, s.outputs);
    wplan.u32(uint32_t(s.frees.size()));
    for (uint32_t f : s.frees) wplan.u32(f);
  }

  const std::string meta_text = meta.dump();
  ByteWriter w;
  // Reserved up front: a GPU engine's weights are hundreds of MB, and growing the buffer by
  // doubling would copy them several times.
  size_t total = kHeaderBytes + 8 + 6 * (kSectionHeaderBytes + kAlign) + text.size() + wtab.bytes().size() +
                 wght.bytes().size() + wplan.bytes().size() + meta_text.size();
  for (const auto& [tag, data] : extra) total += kSectionHeaderBytes + kAlign + data.size();
  w.bytes().reserve(total);
  w.raw(kMagic, sizeof(kMagic));
  w.u32(kEngineFormatVersion);
  w.u32(0);
  w.u64(0);  // the size, patched below
  section(w, "META", meta_text);
  section(w, "GRPH", text);
  section(w, "WTAB", wtab.bytes());
  section(w, "WGHT", wght.bytes());
  section(w, "PLAN", wplan.bytes());
  for (const auto& [tag, data] : extra) {
    if (tag.size() != 4) return KILN_ERROR(kInternal, "engine section tag '{}' is not 4 characters", tag);
    section(w, tag.c_str(), data);
  }
  std::string& b = w.bytes();
  uint64_t size = b.size() + 8;
  std::memcpy(b.data() + 16, &size, 8);
  uint64_t sum = engine_checksum(b.data(), b.size());
  b.append(reinterpret_cast<const char*>(&sum), 8);
  return std::move(b);
}

Expected<nlohmann::json> read_engine_meta(std::string_view bytes, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(Sections s, open_sections(bytes, name));
  return parse_meta(s, name);
}

Expected<EngineFile> read_engine_file(std::shared_ptr<const std::string> bytes, const std::string& name) {
  std::string_view v = *bytes;
  return read_engine_file(v, std::shared_ptr<const void>(bytes, bytes->data()), name);
}

Expected<EngineFile> read_engine_file(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(Sections s, open_sections(bytes, name));
  auto err = [&](const std::string& what) { return KILN_ERROR(kInvalidModel, "{}: {}", name, what); };
  EngineFile f;
  KILN_ASSIGN_OR_RETURN(f.meta, parse_meta(s, name));

  auto [gp, gn] = s.by_tag.at("GRPH");
  ParseOptions po;
  po.zero_elided_tensors = false;
  auto g = parse_graph(std::string_view(gp, gn), po);
  if (!g) return err("GRPH section: " + g.status().message());
  std::unordered_map<std::string, Value*> by_name;
  values_by_name(**g, by_name);

  // Weights: views into the file's bytes, which they keep alive.
  auto [wp, wn] = s.by_tag.at("WGHT");
  auto [tp, tn] = s.by_tag.at("WTAB");
  ByteReader wt(tp, tn, "WTAB section");
  uint32_t n = wt.count("the weight count", 4 + 1 + 4 + 16);
  for (uint32_t i = 0; i < n && wt.ok(); ++i) {
    std::string vname = wt.str("a weight name");
    uint8_t dt = wt.get<uint8_t>("a weight dtype");
    uint32_t rank = wt.count("a weight rank", 8);
    std::vector<int64_t> dims(rank);
    for (auto& d : dims) d = wt.get<int64_t>("a weight dim");
    uint64_t off = wt.get<uint64_t>("a weight offset"), len = wt.get<uint64_t>("a weight size");
    if (!wt.ok()) break;
    auto it = by_name.find(vname);
    if (it == by_name.end() || !it->second->constant || it->second->constant->raw()) {
      return err(fmt::format("weight '{}' is not an elided constant of the graph", vname));
    }
    const Tensor& decl = *it->second->constant;
    if (dt != uint8_t(decl.dtype()) || dims != decl.dims() || len != decl.nbytes() || off > wn || len > wn - off) {
      return err(fmt::format("weight '{}' does not match its declaration {} or lies outside WGHT", vname, decl.summary()));
    }
    void* data = const_cast<char*>(wp + off);
    it->second->constant = Tensor::view(decl.dtype(), decl.dims(), std::const_pointer_cast<void>(owner), data);
  }
  if (!wt.ok()) return err(wt.failed());
  const bool graph_weights = f.meta.value("graph_weights", true);
  if (!graph_weights && n != 0) return err("WTAB lists weights, but META says the graph carries none");
  for (const auto& [vn, v] : by_name) {
    if (graph_weights && v->constant && v->constant->numel() > 0 && !v->constant->raw()) {
      return err(fmt::format("constant '{}' has no data in WTAB", vn));
    }
  }
  if (Status st = verify_graph(**g); !st) return err("GRPH section: " + st.message());

  auto [pp, pn] = s.by_tag.at("PLAN");
  ByteReader r(pp, pn, "PLAN section");
  Plan& p = f.plan;
  p.slots = r.get<uint32_t>("the slot count");
  p.inputs = get_refs(r);
  p.outputs = get_refs(r);
  uint32_t nc = r.count("the constant count", 4);
  for (uint32_t i = 0; i < nc && r.ok(); ++i) {
    std::string cname = r.str("a constant name");
    auto it = by_name.find(cname);
    if (r.ok() && (it == by_name.end() || !it->second->constant)) return err(fmt::format("PLAN names an unknown constant '{}'", cname));
    if (r.ok()) p.constants.push_back(it->second);
  }
  uint32_t ns = r.count("the step count", 1 + 4 + 4 + 4 + 4);
  for (uint32_t i = 0; i < ns && r.ok(); ++i) {
    PlanStep st;
    uint8_t kind = r.get<uint8_t>("a step kind");
    if (r.ok() && kind > uint8_t(StepKind::kHostOp)) {
      return err(fmt::format("step {} has kind {}, which this kiln does not know", i, kind));
    }
    st.kind = StepKind(kind);
    st.node = r.get<uint32_t>("a step's node");
    st.inputs = get_refs(r);
    st.outputs = get_refs(r);
    st.frees.resize(r.count("a step's frees", 4));
    for (auto& x : st.frees) x = r.get<uint32_t>("a freed slot");
    p.steps.push_back(std::move(st));
  }
  if (!r.ok()) return err(r.failed());
  if (p.slots > (1u << 28)) return err("PLAN section: implausible slot count");
  p.graph = std::move(*g);
  if (Status st = verify_plan(p); !st) return err(st.message());
  for (const std::string& tag : s.order) {
    if (tag == "META" || tag == "GRPH" || tag == "WTAB" || tag == "WGHT" || tag == "PLAN") continue;
    auto [xp, xn] = s.by_tag.at(tag);
    f.extra[tag] = std::string_view(xp, xn);
  }
  return f;
}

}  // namespace kiln
