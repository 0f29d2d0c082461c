#include "services/router/dashboard_api.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace tandem {

MetricsHistory::Query ParseSummaryQuery(const std::string& query) {
  MetricsHistory::Query q;
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    double v = 0;
    if (!absl::SimpleAtod(kv.second, &v) || !std::isfinite(v)) continue;
    if (kv.first == "since") {
      if (v > 0) q.since_unix_s = v;
      continue;
    }
    v = std::clamp(v, 1.0, 3600.0);
    if (kv.first == "window") q.window_s = v;
    else if (kv.first == "series") q.series_s = v;
    else if (kv.first == "step") q.step_s = v;
  }
  return q;
}

absl::Status InstallDashboard(service::AdminServer& admin, const MetricsHistory* history,
                              const std::string& directory, const HandlerGuard& guard) {
  service::AdminServer::Handler summary = [history](const service::HttpRequest& request) {
    if (history == nullptr) {
      return service::HttpResponse::Json(R"({"metrics_enabled":false})");
    }
    service::HttpResponse response = service::HttpResponse::Json(history->ToJson(ParseSummaryQuery(request.query)).dump());
    response.headers.emplace_back("Cache-Control", "no-store");
    return response;
  };
  admin.AddHandler("/api/summary", guard ? guard(std::move(summary)) : std::move(summary));
  absl::Status s = admin.AddStaticDirectory("/dashboard", directory);
  if (!s.ok()) {
    const std::string hint = "dashboard files not found in " + directory +
                             ": build the tandem_dashboard_assets target (after scripts/install-deps.sh installs uPlot) "
                             "or pass --dashboard-dir\n";
    for (const char* path : {"/dashboard", "/dashboard/"}) {
      admin.AddHandler(path, [hint](const service::HttpRequest&) { return service::HttpResponse::Text(404, hint); });
    }
  }
  return s;
}

std::string DefaultDashboardDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "share/tandem/dashboard";
  return (exe.parent_path().parent_path() / "share" / "tandem" / "dashboard").string();
}

}  // namespace tandem
