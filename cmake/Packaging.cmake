# The Debian package (`make package`): CPack's DEB generator over the install
# rules, so the package holds exactly what `make install` installs.
#
# Files go under /usr whatever the build was configured with, because the
# units in systemd/ name /usr/sbin/sluiced and /etc/sluice/sluice.toml.
# CPACK_SET_DESTDIR makes CPack install with that prefix into a DESTDIR, which
# is what the install-time rules for the config and sluice.pc need (they
# read CMAKE_INSTALL_PREFIX). Configure with -DCMAKE_INSTALL_PREFIX=/usr, as
# `make package` does, for Debian's multiarch libdir (lib/x86_64-linux-gnu).
#
# /usr/share/doc/sluice/copyright is generated from LICENSE (below).
#
# Control files from cmake/debian/: postinst (sysusers, daemon-reload; never
# enables or starts a unit), prerm (stops the units on removal), postrm
# (daemon-reload), triggers (ldconfig), and the generated conffiles.

set(SLUICE_PACKAGE_MAINTAINER
  "sluice maintainers <maintainers@users.noreply.a-seed-8f6cc3cf.example>"
  CACHE STRING "The Maintainer field of the Debian package")

# The copyright file (Debian's machine-readable format) carries LICENSE's own
# notice, the one its appendix says to attach, and points at the full text in
# /usr/share/common-licenses/Apache-2.0, as Debian policy asks. Configuring
# fails if LICENSE stops being that licence, so the two cannot drift apart.
file(READ ${PROJECT_SOURCE_DIR}/LICENSE _sluice_license)
string(FIND "${_sluice_license}" "Licensed under the Apache License, Version 2.0"
  _sluice_notice_at)
if(NOT _sluice_license MATCHES "^[ \n]*Apache License\n *Version 2\.0," OR _sluice_notice_at EQUAL -1)
  message(FATAL_ERROR "LICENSE is not the Apache License 2.0 with its appendix: "
                      "update cmake/debian/copyright.in with it.")
endif()
string(SUBSTRING "${_sluice_license}" ${_sluice_notice_at} -1 _sluice_notice)
string(STRIP "${_sluice_notice}" _sluice_notice)
# One space before each line of the notice, " ." for an empty one.
string(REGEX REPLACE "\n *\n" "\n.\n" _sluice_notice "${_sluice_notice}")
string(REGEX REPLACE "\n *" "\n " _sluice_notice "${_sluice_notice}")
set(SLUICE_LICENSE_NOTICE " ${_sluice_notice}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/debian/copyright.in
               ${PROJECT_BINARY_DIR}/debian/copyright @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/debian/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})

# The package's changelog (cmake/debian/changelog, Debian's format; one entry
# per release, newest first), compressed as policy asks for
# /usr/share/doc/sluice/changelog.gz. Configuring fails when its newest entry
# is not this version, so a release cannot ship without its entry.
file(STRINGS ${PROJECT_SOURCE_DIR}/cmake/debian/changelog _sluice_changelog_top LIMIT_COUNT 1)
string(REPLACE "." "\\." _sluice_version_re "${PROJECT_VERSION}")
if(NOT _sluice_changelog_top MATCHES "^sluice \\(${_sluice_version_re}\\) ")
  message(FATAL_ERROR "cmake/debian/changelog: the newest entry is \"${_sluice_changelog_top}\", "
                      "not version ${PROJECT_VERSION}; add an entry for it at the top.")
endif()
add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/debian/changelog.gz
  COMMAND sh -c "gzip -9n -c ${PROJECT_SOURCE_DIR}/cmake/debian/changelog > changelog.gz"
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}/debian
  DEPENDS ${PROJECT_SOURCE_DIR}/cmake/debian/changelog
  COMMENT "Compressing the package's changelog"
  VERBATIM)
add_custom_target(sluice_changelog ALL DEPENDS ${PROJECT_BINARY_DIR}/debian/changelog.gz)
install(FILES ${PROJECT_BINARY_DIR}/debian/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR DEB)
# Quotes and semicolons in the values below reach the package as written.
set(CPACK_VERBATIM_VARIABLES ON)
set(CPACK_PACKAGE_NAME sluice)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${SLUICE_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "per-host rate-limiting sidecar daemon")
set(CPACK_PACKAGE_DESCRIPTION [[
sluiced answers whether a key may spend units of a rule now, over a Unix
socket in MessagePack-RPC, decided on lock-free counters in memory. Local
rules are decided on the node alone; global rules share one limit across a
fleet through leases from Redis.
.
This package holds the daemon, its systemd units (neither enabled nor
started on install), sluicectl, and libsluice, the C client (shared and
static library, header, pkg-config file).]])
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# dpkg-shlibdeps turns the libraries the binaries load into Depends.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "redis-server")
set(CPACK_STRIP_FILES ON)

set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)

# The config is the one conffile: dpkg keeps an operator's edits on upgrade.
# Its path follows the rule of the top-level install code for the prefix /usr.
if(IS_ABSOLUTE "${CMAKE_INSTALL_SYSCONFDIR}")
  set(_sluice_package_config "${CMAKE_INSTALL_SYSCONFDIR}/sluice/sluice.toml")
else()
  set(_sluice_package_config "/${CMAKE_INSTALL_SYSCONFDIR}/sluice/sluice.toml")
endif()
file(WRITE ${PROJECT_BINARY_DIR}/debian/conffiles "${_sluice_package_config}\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${PROJECT_BINARY_DIR}/debian/conffiles
  ${PROJECT_SOURCE_DIR}/cmake/debian/postinst
  ${PROJECT_SOURCE_DIR}/cmake/debian/prerm
  ${PROJECT_SOURCE_DIR}/cmake/debian/postrm
  ${PROJECT_SOURCE_DIR}/cmake/debian/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
