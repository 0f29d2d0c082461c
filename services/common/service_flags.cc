#include "services/common/service_flags.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "services/common/host_port.h"
#include "services/common/logging.h"
#include "yaml-cpp/yaml.h"

namespace tandem::service {
namespace {

constexpr char kEnvPrefix[] = "TANDEM_";

bool EnvironmentSet(const std::string& name) {
  if (name.empty()) return false;
  const char* value = std::getenv(name.c_str());
  return value != nullptr && value[0] != '\0';
}

// The long name an option is known by in config files ("admin-listen"), or "".
std::string ConfigName(const CLI::Option& opt) {
  return opt.get_lnames().empty() ? std::string() : opt.get_lnames().front();
}

// Reads YAML (and so JSON) config files into CLI11 config items, one per top-level key.
class YamlConfig : public CLI::Config {
 public:
  explicit YamlConfig(CLI::App* app) : app_(app) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    const std::string file = FileName();
    YAML::Node root;
    try {
      root = YAML::Load(input);
    } catch (const YAML::Exception& e) {
      throw CLI::ConfigError(absl::StrCat("config file ", file, ": not valid YAML or JSON: ", e.what()));
    }
    std::vector<CLI::ConfigItem> items;
    if (root.IsNull()) return items;  // an empty file sets nothing
    if (!root.IsMap()) {
      throw CLI::ConfigError(absl::StrCat("config file ", file,
                                          ": expected a map of flag names to values at the top level"));
    }
    for (const auto& entry : root) {
      if (!entry.first.IsScalar()) {
        throw CLI::ConfigError(absl::StrCat("config file ", file, ": a key is not a plain name"));
      }
      const std::string key = entry.first.Scalar();
      const CLI::Option* opt = FindOption(key);
      if (opt == nullptr) {
        throw CLI::ConfigError(absl::StrCat("config file ", file, ": unknown key '", key,
                                            "' (there is no flag --", key, "; see --help)"));
      }
      if (!opt->get_configurable()) {
        throw CLI::ConfigError(
            absl::StrCat("config file ", file, ": key '", key, "' cannot be set from a config file"));
      }
      CLI::ConfigItem item;
      item.name = ConfigName(*opt);
      item.inputs = Values(file, key, *opt, entry.second);
      // Precedence: the environment over the config file. CLI11 2.1.2 applies the
      // config file first and the environment only to options still unset, so a key
      // whose variable is set is left to the environment.
      if (EnvironmentSet(opt->get_envname())) continue;
      items.push_back(std::move(item));
    }
    return items;
  }

  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override {
    YAML::Emitter out;
    out << YAML::BeginMap;
    for (const CLI::Option* opt : app->get_options()) {
      const std::string name = ConfigName(*opt);
      if (name.empty() || !opt->get_configurable() || opt == app->get_help_ptr()) continue;
      const bool multi = opt->get_items_expected_max() > 1;
      std::vector<std::string> values = opt->results();
      if (values.empty()) {
        // Defaults of list options are shown as "[...]" strings: leave them out.
        if (!default_also || multi || opt->get_default_str().empty()) continue;
        values = {opt->get_default_str()};
      }
      if (write_description && !opt->get_description().empty()) {
        out << YAML::Comment(opt->get_description());
      }
      out << YAML::Key << prefix + name << YAML::Value;
      if (multi) {
        out << YAML::Flow << YAML::BeginSeq;
        for (const auto& value : values) out << value;
        out << YAML::EndSeq;
      } else {
        out << values.back();
      }
    }
    out << YAML::EndMap;
    return std::string(out.c_str()) + "\n";
  }

 private:
  const CLI::Option* FindOption(const std::string& key) const {
    if (key.empty() || key.front() == '-') return nullptr;
    const CLI::Option* opt = app_->get_option_no_throw("--" + key);
    if (opt == nullptr && key.find('_') != std::string::npos) {
      std::string dashed = key;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      opt = app_->get_option_no_throw("--" + dashed);
    }
    if (opt == nullptr || ConfigName(*opt).empty() || opt == app_->get_help_ptr() ||
        opt == app_->get_help_all_ptr()) {
      return nullptr;
    }
    return opt;
  }

  static std::vector<std::string> Values(const std::string& file, const std::string& key,
                                         const CLI::Option& opt, const YAML::Node& node) {
    auto error = [&](std::string_view why) {
      return CLI::ConfigError(absl::StrCat("config file ", file, ": key '", key, "': ", std::string(why)));
    };
    if (node.IsScalar()) return {node.Scalar()};
    if (node.IsNull()) throw error("has no value");
    if (node.IsMap()) throw error("expected a value or a list of values, not a map");
    std::vector<std::string> values;
    for (const auto& element : node) {
      if (!element.IsScalar()) throw error("expected a list of plain values");
      values.push_back(element.Scalar());
    }
    const int max_values = opt.get_type_size() == 0 ? 1 : opt.get_items_expected_max();
    if (static_cast<int>(values.size()) > std::max(max_values, 1)) {
      throw error(absl::StrCat("--", ConfigName(opt), " takes ",
                               max_values <= 1 ? std::string("one value") : absl::StrCat("at most ", max_values, " values"),
                               ", got a list of ", values.size()));
    }
    return values;
  }

  // The file being read, for messages: the --config value, or the default the
  // environment gave it.
  std::string FileName() const {
    const CLI::Option* opt = app_->get_config_ptr();
    if (opt == nullptr) return "";
    if (!opt->results().empty()) return opt->results().back();
    return opt->get_default_str();
  }

  CLI::App* app_;
};

CLI::Validator HostPortValidator(bool allow_empty) {
  return CLI::Validator(
      [allow_empty](std::string& value) -> std::string {
        if (allow_empty && value.empty()) return "";
        auto parsed = ParseHostPort(value);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      "", "HOST:PORT");
}

void BindOptions(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt == app.get_help_ptr() || opt == app.get_help_all_ptr()) continue;
    if (opt->get_envname().empty()) {
      std::string name = ConfigName(*opt);
      if (name.empty() && !opt->get_snames().empty()) name = opt->get_snames().front();
      if (name.empty()) name = opt->get_single_name();
      if (!name.empty()) opt->envname(EnvironmentVariableFor(name));
    }
    if (opt->get_default_str().empty()) opt->capture_default_str();
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) BindOptions(*sub);
}

// TANDEM_CONFIG (the --config option's variable) must name the file before CLI11 reads
// config files, which it does before it looks at the environment: make the variable
// the option's default and require the file to exist then.
void ApplyConfigFileFromEnvironment(CLI::App& app) {
  CLI::Option* config = app.get_config_ptr();
  if (config == nullptr || !EnvironmentSet(config->get_envname())) return;
  config->default_str(std::getenv(config->get_envname().c_str()));
  config->required(true);
}

}  // namespace

std::string EnvironmentVariableFor(const std::string& name) {
  std::string result = kEnvPrefix;
  size_t start = name.find_first_not_of('-');
  for (size_t i = start == std::string::npos ? name.size() : start; i < name.size(); ++i) {
    char c = name[i];
    result.push_back(std::isalnum(static_cast<unsigned char>(c))
                         ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                         : '_');
  }
  return result;
}

void AddCommonFlags(CLI::App& app, CommonFlags* flags, const CommonFlagDefaults& defaults) {
  flags->listen = defaults.listen;
  flags->admin_listen = defaults.admin_listen;
  flags->router = defaults.router;
  flags->model = defaults.model;
  flags->log_level = defaults.log_level;
  flags->log_format = defaults.log_format;

  app.add_option("--listen", flags->listen, "gRPC address to serve on (port 0: any free port)")
      ->type_name("HOST:PORT")
      ->check(HostPortValidator(false))
      ->capture_default_str();
  app.add_option("--admin-listen", flags->admin_listen,
                 "HTTP admin address: /metrics, /healthz, /readyz (port 0: any free port)")
      ->type_name("HOST:PORT")
      ->check(HostPortValidator(false))
      ->capture_default_str();
  app.add_option("--ready-file", flags->ready_file,
                 "Write this JSON file (bound addresses) once ready; none by default")
      ->type_name("PATH");
  if (defaults.with_router) {
    app.add_option("--router", flags->router, "Router to register with (none by default)")
        ->type_name("HOST:PORT")
        ->check(HostPortValidator(true))
        ->capture_default_str();
  }
  if (defaults.with_model) {
    app.add_option("--model", flags->model,
                   "Model: a Hugging Face checkpoint directory, or 'tiny' (built in)")
        ->type_name("DIR|tiny")
        ->capture_default_str();
  }
  app.add_option("--log-level", flags->log_level, "Least severe log level written")
      ->type_name("LEVEL")
      ->check(CLI::IsMember(LogLevelNames()))
      ->capture_default_str();
  app.add_option("--log-format", flags->log_format, "Log line format: text or json (one object per line)")
      ->type_name("FORMAT")
      ->check(CLI::IsMember(LogFormatNames()))
      ->capture_default_str();

  app.config_formatter(std::make_shared<YamlConfig>(&app));
  app.set_config("--config", "",
                 "Read flags from a YAML or JSON file: a map of long flag names to values "
                 "(command line > environment > file > default)")
      ->type_name("FILE")
      ->each([flags](const std::string& path) { flags->config = path; });
}

void BindEnvironment(CLI::App& app) { BindOptions(app); }

std::optional<int> ParseCommandLine(CLI::App& app, int argc, const char* const* argv) {
  ApplyConfigFileFromEnvironment(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

int ParseOrExit(CLI::App& app, int argc, char** argv) {
  std::optional<int> exit_code = ParseCommandLine(app, argc, argv);
  if (!exit_code.has_value()) return 0;
  if (*exit_code == 0) {
    std::fflush(stdout);
    std::exit(0);
  }
  return *exit_code;
}

}  // namespace tandem::service
