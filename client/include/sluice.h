/* sluice.h: the libsluice client API (placeholder; the client owner fills it in). */
#ifndef SLUICE_H
#define SLUICE_H

#define SLUICE_VERSION_MAJOR 0
#define SLUICE_VERSION_MINOR 1
#define SLUICE_VERSION_PATCH 0

#endif
