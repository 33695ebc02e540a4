#include <stdio.h>
int main(void) { printf("1..0 # SKIP placeholder\n"); return 0; }
