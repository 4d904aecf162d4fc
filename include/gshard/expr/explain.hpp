#pragma once
// explain(expr): the partitioned plan of an expression on this rank, without running it: each
// op with its source line, its operands and result (layouts, global shapes), its local kernel,
// and every collective an operand needs (kind, axes, bytes this rank sends).
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "node.hpp"

namespace gshard {
namespace detail {

struct PlannedCollective {
  std::string operand;  // which operand, as the step names it
  ReshardPlan plan;
};

struct PlanStep {
  std::string id;  // "%0"
  std::string op;
  std::string where;
  std::vector<std::string> operands;
  std::string kernel;
  std::string result;
  std::vector<PlannedCollective> collectives;
  std::string note;                        // why this plan (the einsum planner's choice)
  std::optional<PlannedCollective> after;  // a collective on the op's own result
};

class Planner {
 public:
  template <class MeshT>
  explicit Planner(const MeshT& mesh) : mesh_(mesh.describe()), rank_(mesh.rank()) {
    for (std::size_t i = 0; i < MeshT::axis_names.size(); ++i) names_[i] = MeshT::axis_names[i];
  }

  [[nodiscard]] std::string layout(const Layout& l) const { return layout_string(l, names_); }
  [[nodiscard]] std::string describe(const Layout& l, const Shape& shape) const {
    return std::string("\"") + layout(l) + "\" " + shape_string(shape);
  }

  /// A name for an operand: an input tensor, or the id of the step computing it (planned once).
  template <class E>
  std::string ref(const E& e) {
    if constexpr (is_sharded_v<E>) {
      const void* key = e.local_view().data();
      auto it = inputs_.find(key);
      if (it != inputs_.end()) return it->second;
      const std::string name = std::string("in") + std::to_string(inputs_.size());
      inputs_.emplace(key, name);
      input_lines_.push_back(name + " = input " + describe(E::layout, e.shape()));
      return name;
    } else {
      const void* key = &NodeAccess::state(e);
      auto it = nodes_.find(key);
      if (it != nodes_.end()) return it->second;
      const std::string id = NodeAccess::plan(e, *this);
      nodes_.emplace(key, id);
      return id;
    }
  }

  std::string add(PlanStep step) {
    step.id = std::string("%") + std::to_string(steps_.size());
    steps_.push_back(std::move(step));
    return steps_.back().id;
  }

  [[nodiscard]] std::string str() const {
    std::ostringstream s;
    std::int64_t calls = 0, bytes = 0;
    for (const auto& st : steps_) {
      std::vector<const PlannedCollective*> all;
      for (const auto& c : st.collectives) all.push_back(&c);
      if (st.after) all.push_back(&*st.after);
      for (const auto* c : all) {
        for (const auto& step : c->plan.steps)
          if (step.axes != 0) ++calls;
        bytes += c->plan.bytes();
      }
    }
    s << "gshard plan on " << mesh_ << ", rank " << rank_ << ": " << steps_.size() << " op(s), "
      << calls << " implicit collective(s), " << bytes << " bytes sent by this rank\n";
    for (const auto& line : input_lines_) s << "  " << line << "\n";
    for (const auto& st : steps_) {
      s << "  " << st.id << " = " << st.op << "   at " << st.where << "\n";
      for (std::size_t i = 0; i < st.operands.size(); ++i)
        s << "      operand " << i << ": " << st.operands[i] << "\n";
      auto collective = [&](const PlannedCollective& c) {
        s << "      implicit, for " << c.operand << ": ";
        std::istringstream lines(explain(c.plan));
        std::string line;
        bool first = true;
        while (std::getline(lines, line)) {
          s << (first ? "" : "        ") << line << "\n";
          first = false;
        }
      };
      for (const auto& c : st.collectives) collective(c);
      if (!st.note.empty()) s << "      " << st.note << "\n";
      s << "      local: " << st.kernel << "\n";
      if (st.after) collective(*st.after);
      s << "      result: " << st.result << "\n";
    }
    return s.str();
  }

 private:
  std::string mesh_;
  int rank_ = 0;
  std::array<std::string_view, max_axes> names_{};
  std::map<const void*, std::string> inputs_, nodes_;
  std::vector<std::string> input_lines_;
  std::vector<PlanStep> steps_;
};

}  // namespace detail

/// The partitioned plan of an expression (or a tensor) on this rank, as text. Runs nothing.
template <Expression E>
std::string explain(const E& e) {
  detail::Planner p(e.mesh());
  (void)p.ref(e);
  return p.str();
}

/// explain(e), then evaluating it into Target's layout (what `Target y = e;` does): the reshard
/// that evaluation adds when the layouts differ, at the user's line `where`.
template <class Target, Expression E>
std::string explain(const E& e, std::source_location where = std::source_location::current()) {
  detail::Planner p(e.mesh());
  const std::string id = p.ref(e);
  if constexpr (!(E::layout == Target::layout)) {
    detail::PlanStep st;
    st.op = std::string("evaluate into the declared layout \"").append(Target::spec.view()) + "\"";
    st.where = detail::where_string(where);
    st.operands.push_back(id + " " + p.describe(E::layout, e.shape()));
    st.collectives.push_back({id, detail::plan_operand(e, Target::layout)});
    st.kernel = "none";
    st.result = p.describe(Target::layout, detail::shape_in(Target::layout, E::layout, e.shape()));
    (void)p.add(std::move(st));
  }
  return p.str();
}

}  // namespace gshard
