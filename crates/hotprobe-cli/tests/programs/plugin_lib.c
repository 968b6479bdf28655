/* The plugin plugin_loader.c loads and unloads without end. */
int plugin_value(void) { return 42; }
