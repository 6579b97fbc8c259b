/* SPDX-License-Identifier: MIT */
/* Preloaded under ASan: keeps modules mapped at exit so leak stacks have names. */
int dlclose(void *handle);

int dlclose(void *handle) {
  (void)handle;
  return 0;
}
