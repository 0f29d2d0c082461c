#include "services/security/pem_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/str_cat.h"

namespace tandem::security {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat(flag, ": cannot read ", path, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM block (-----BEGIN ...)"));
  }
  return pem;
}

absl::Status CheckKeyPair(const std::string& cert, const std::string& cert_flag, const std::string& key,
                          const std::string& key_flag) {
  struct BioFree {
    void operator()(BIO* b) const { BIO_free(b); }
  };
  struct X509Free {
    void operator()(X509* x) const { X509_free(x); }
  };
  struct KeyFree {
    void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  };
  std::unique_ptr<BIO, BioFree> cert_bio(BIO_new_mem_buf(cert.data(), static_cast<int>(cert.size())));
  std::unique_ptr<BIO, BioFree> key_bio(BIO_new_mem_buf(key.data(), static_cast<int>(key.size())));
  if (!cert_bio || !key_bio) return absl::ResourceExhaustedError("out of memory reading PEM");
  std::unique_ptr<X509, X509Free> x509(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (!x509) return absl::InvalidArgumentError(absl::StrCat(cert_flag, ": no X.509 certificate in the PEM file"));
  std::unique_ptr<EVP_PKEY, KeyFree> pkey(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (!pkey) {
    return absl::InvalidArgumentError(absl::StrCat(key_flag, ": no unencrypted private key in the PEM file"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, ": the key does not belong to the certificate of ", cert_flag));
  }
  return absl::OkStatus();
}

}  // namespace tandem::security
