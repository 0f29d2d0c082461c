// The router's built-in dashboard (docs/design.md §9): the page at /dashboard/ (static files
// the build copies next to the binary: services/router/dashboard/ and uPlot from npm) and
// the JSON it polls, /api/summary (MetricsHistory::ToJson; query parameters window=,
// series=, step= in seconds, since= a Unix time). The replicas table reads /replicas.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "services/common/admin_server.h"
#include "services/router/metrics_history.h"

namespace tandem {

// Wraps a handler in a check (the API key check of services/security when keys are
// configured); empty: none.
using HandlerGuard = std::function<service::AdminServer::Handler(service::AdminServer::Handler)>;

// Adds /api/summary (from `history`; null: metrics are off and it says so; behind
// `guard`) and the page from `directory` (static files, open: they hold no data).
// Errors: NOT_FOUND when `directory` is missing; /api/summary is installed anyway and
// /dashboard then answers 404 with a hint.
absl::Status InstallDashboard(service::AdminServer& admin, const MetricsHistory* history,
                              const std::string& directory, const HandlerGuard& guard = nullptr);

// Where the build puts the page: <directory of this executable>/../share/tandem/dashboard.
std::string DefaultDashboardDir();

// "window=30&step=5" -> the query; "since=UNIX_SECONDS" summarizes from then instead of a
// window (a benchmark run). Unknown or bad values keep their defaults; window, series and
// step are clamped to [1 s, 1 h].
MetricsHistory::Query ParseSummaryQuery(const std::string& query);

}  // namespace tandem
