// Placeholder until the app lands.
int main() { return 0; }
